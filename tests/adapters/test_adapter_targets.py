"""Targets resolved once on RE2: equal to peft's own matching on ordinary patterns, bounded on
hostile ones, and refused clearly where RE2 and Python's re (PEFT) would disagree."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import time

import pytest

from loraplex.adapters.peft_format import AdapterFormatError, parse_adapter_config
from loraplex.adapters.targets import ResolvedTargets, module_paths, resolve_targets
from loraplex.bench._synthetic.models import TINY

REDOS = r"model\.layers\.0\.self_attn\.q_proj|(.+)+X"

# Ordinary configs: every matching rule of PEFT (regex, list, suffix, exact name, exclude as
# list and regex, layers_to_transform with and without layers_pattern, rank/alpha patterns).
PEFT_CASES = [
    dict(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"]),
    dict(r=8, lora_alpha=16, target_modules=r".*\.(q|k)_proj"),
    dict(r=8, lora_alpha=16, target_modules=REDOS.replace("|(.+)+X", "|.*mlp\\.up_proj")),
    dict(r=4, lora_alpha=4, target_modules=["o_proj", "gate_proj"], layers_to_transform=[1]),
    dict(
        r=4,
        lora_alpha=4,
        target_modules=["down_proj", "model.layers.0.self_attn.q_proj"],
        layers_to_transform=[1],
        layers_pattern="layers",
    ),
    dict(
        r=4,
        lora_alpha=4,
        target_modules=["up_proj"],
        layers_to_transform=0,
        layers_pattern=["nope", "layers"],
    ),  # fmt: skip
    dict(
        r=6,
        lora_alpha=10,
        target_modules=["k_proj", "q_proj"],
        exclude_modules=["layers.0.self_attn.q_proj"],
    ),  # fmt: skip
    dict(r=6, lora_alpha=10, target_modules=["k_proj", "q_proj"], exclude_modules=r".*\.1\..*"),
    dict(
        r=16,
        lora_alpha=32,
        target_modules=r".*\.(q_proj|down_proj|up_proj)",
        rank_pattern={"down_proj": 4, r"layers\.1\.self_attn\.q_proj": 12, "proj": 2},
        alpha_pattern={"up_proj": 5, r"^model.*q_proj": 7},
    ),
    dict(
        r=8,
        lora_alpha=8,
        target_modules="all-linear",
        use_rslora=True,
        rank_pattern={"v_proj|k_proj": 2},
    ),  # fmt: skip
]


def _peft_view(case: dict) -> dict[str, tuple[int, float]]:
    """peft's own answer for each module name: (rank, scale) of the targeted ones."""
    from peft import LoraConfig
    from peft.tuners.tuners_utils import check_target_module_exists
    from peft.utils.other import get_pattern_key

    kwargs = dict(case)
    if kwargs.get("target_modules") == "all-linear":  # peft expands it against the model
        kwargs["target_modules"] = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj",
                                    "up_proj", "down_proj"]  # fmt: skip
    cfg = LoraConfig(**kwargs)
    out = {}
    for _, _, key in module_paths(TINY):
        found = check_target_module_exists(cfg, key)
        if not found or type(found).__name__ == "_ExcludedModule":
            continue
        r = cfg.rank_pattern.get(get_pattern_key(cfg.rank_pattern.keys(), key), cfg.r)
        alpha = cfg.alpha_pattern.get(
            get_pattern_key(cfg.alpha_pattern.keys(), key), cfg.lora_alpha
        )
        out[key] = (r, alpha / math.sqrt(r) if cfg.use_rslora else alpha / r)
    return out


@pytest.mark.parametrize("case", range(len(PEFT_CASES)))
def test_resolution_equals_peft(case: int) -> None:
    cfg = PEFT_CASES[case]
    ours = resolve_targets(parse_adapter_config(cfg), TINY)
    names = {(i, m): key for i, m, key in module_paths(TINY)}
    got = {names[k]: (t.rank, t.scale) for k, t in ours.modules.items()}
    want = _peft_view(cfg)
    assert set(got) == set(want), cfg
    for key, (r, scale) in want.items():
        assert got[key][0] == r and math.isclose(got[key][1], scale, rel_tol=1e-12), key
    assert ResolvedTargets.from_json(ours.to_json()) == ours


CATASTROPHIC_CHILD = """
import json, sys
from loraplex.adapters.peft_format import parse_adapter_config
from loraplex.adapters.targets import resolve_targets
spec = json.loads(sys.argv[1])
targets = resolve_targets(parse_adapter_config(spec["cfg"]), spec["base"])
print(json.dumps([list(m) for m in targets.modules]))
"""


def test_catastrophic_pattern_resolves_in_bounded_time() -> None:
    # Python's re needs minutes on this (exponential backtracking); RE2 is linear. The match
    # runs in a child under its own bound, so a regression fails here, in seconds, rather than
    # hanging until the suite's global timeout (the GIL-holding match would starve a thread).
    spec = {
        "cfg": {"r": 4, "lora_alpha": 8, "target_modules": REDOS},
        "base": TINY | {"num_hidden_layers": 2000},
    }
    began = time.monotonic()
    try:
        done = subprocess.run(
            [sys.executable, "-c", CATASTROPHIC_CHILD, json.dumps(spec)],
            capture_output=True,
            text=True,
            timeout=60,
        )
    except subprocess.TimeoutExpired:
        pytest.fail("resolving the pattern did not finish in 60 s: not a linear-time matcher")
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout) == [[0, "q_proj"]]
    assert time.monotonic() - began < 60


@pytest.mark.parametrize(
    ("field", "value", "why"),
    [
        ("target_modules", r"(q)_proj\1", "linear time"),
        ("target_modules", r".*(?=q_proj)q_proj", "linear time"),
        ("target_modules", r"(?>.*)q_proj", "linear time"),
        ("target_modules", "[[:alpha:]]", "read differently"),
        ("target_modules", "q{,3}", "read differently"),
        ("target_modules", "(", "not a valid regular expression"),
        ("rank_pattern", {"(?i)q_proj": 4}, "not a valid regular expression"),
        ("alpha_pattern", {r"(a)\1": 4}, "linear time"),
        ("layers_pattern", "layers(", "not a valid regular expression"),
        ("layers_pattern", "(?P<idx>x)", "not a valid regular expression"),
        ("exclude_modules", r"(?<=x)y", "linear time"),
    ],
)
def test_patterns_re2_cannot_run_or_peft_cannot_read_are_refused(field, value, why) -> None:
    cfg = {"r": 4, "lora_alpha": 8, "target_modules": ["q_proj"], "layers_to_transform": [0]}
    with pytest.raises(AdapterFormatError, match=why):
        parse_adapter_config(cfg | {field: value})


@pytest.mark.parametrize(
    "bad",
    [
        None,
        {"format": 1, "groups": []},
        {"format": 1, "groups": [{"rank": 0, "alpha": 1, "scale": 1, "layers": {"q_proj": [0]}}]},
        {"format": 1, "groups": [{"rank": 4, "alpha": 1, "scale": 1, "layers": {"lm_head": [0]}}]},
        {
            "format": 1,
            "groups": [{"rank": 4, "alpha": 1, "scale": float("nan"), "layers": {"q_proj": [0]}}],
        },  # fmt: skip
        {
            "format": 1,
            "groups": [{"rank": 4, "alpha": 1, "scale": 1, "layers": {"q_proj": [0, 0]}}],
        },
        {"format": 2, "groups": [{"rank": 4, "alpha": 1, "scale": 1, "layers": {"q_proj": [0]}}]},
    ],
)
def test_resolved_targets_from_the_network_are_checked(bad) -> None:
    with pytest.raises(AdapterFormatError):
        ResolvedTargets.from_json(bad)
