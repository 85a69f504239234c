"""Maps each top-level folder to a `loraplex.<part>` subpackage (see ARCHITECTURE.md).

`platform/` has no `__init__.py` at its root so it never shadows the standard library's
`platform` module; it is a namespace portion, so packages are discovered as namespaces.
"""

from pathlib import Path

from setuptools import find_namespace_packages, setup

# The runtime: what the container images copy and install.
PARTS = ["platform", "adapters", "moe", "loader", "api", "migrations"]
# The benchmarks (`loraplex bench NAME`): installed from a source checkout, left out of the
# images (their build context holds PARTS only), so no runtime install carries them.
OPTIONAL_PARTS = ["bench"]
EXCLUDE = ["*__pycache__*", "*.egg-info*"]
HERE = Path(__file__).resolve().parent

packages: list[str] = []
package_dir: dict[str, str] = {}
for part in PARTS + [p for p in OPTIONAL_PARTS if (HERE / p).is_dir()]:
    package_dir[f"loraplex.{part}"] = part
    packages.append(f"loraplex.{part}")
    packages += [
        f"loraplex.{part}.{sub}" for sub in find_namespace_packages(where=part, exclude=EXCLUDE)
    ]

# infra/ is Terraform, Dockerfiles and manifests; only its Kubernetes templates and their
# renderer are Python (the control plane's Kubernetes launcher renders engine resources).
package_dir["loraplex.infra"] = "infra"
packages += ["loraplex.infra", "loraplex.infra.k8s"]

setup(
    packages=packages,
    package_dir=package_dir,
    package_data={
        # *.c: the native CPU kernels, compiled on the serving machine at first use.
        "": ["*.html", "*.css", "*.js", "*.ini", "*.mako", "*.json", "*.jinja", "*.c"],
        "loraplex.infra.k8s": ["templates/*.j2", "values/*.yaml"],
        # The console's templates and static files, vendored libraries with their licences.
        "loraplex.api.console": [
            "templates/*.html",
            "static/*.css",
            "static/*.js",
            "static/vendor/*.md",
            "static/vendor/*/*",
        ],
    },
    include_package_data=True,
)
