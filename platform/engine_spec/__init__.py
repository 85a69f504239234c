"""What an engine replica is asked to be, torch-free: `EngineConfig` (every engine default),
its command line (`engine_args` / `parse_engine_args`), the deployment-row mapping
(`engine_config_for_deployment`, what launchers call), and the table of what the engine
serves (`supported_models`). The control plane imports this package, never `engine/`."""

from loraplex.platform.engine_spec.cli import (
    ServerOptions,
    build_engine_parser,
    engine_args,
    parse_engine_args,
)
from loraplex.platform.engine_spec.config import EngineConfig, engine_default
from loraplex.platform.engine_spec.deployment import (
    UnservableDeploymentError,
    engine_args_for_deployment,
    engine_config_for_deployment,
    on_a_shared_machine,
)

__all__ = [
    "EngineConfig",
    "ServerOptions",
    "UnservableDeploymentError",
    "build_engine_parser",
    "engine_args",
    "engine_args_for_deployment",
    "engine_config_for_deployment",
    "engine_default",
    "on_a_shared_machine",
    "parse_engine_args",
]
