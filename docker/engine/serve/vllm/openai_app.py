"""The OpenAI-compatible vLLM endpoint, shared by the per-version modules
(``serve.vllm.v0_12_0.app:app_builder`` ...).

One Serve deployment whose replicas each run vLLM's async engine (``AsyncLLM``)
on the model and serve vLLM's own OpenAI application (the FastAPI app of
``vllm serve``: ``/v1/models``, ``/v1/chat/completions``, ``/v1/completions``
with SSE streaming, ``/v1/embeddings`` for pooling models, ``/health``,
``/tokenize`` ...) as the deployment's ASGI ingress; every answer carries
an ``x-argus-engine`` header naming the image (e.g. ``vllm/v0.13.0-cpu``). So the protocol, its
validation and its error bodies are vLLM's, and the engine arguments are
``vllm serve``'s. Ray 2.53's ``ray.serve.llm`` was tried first and does not
start on vLLM's CPU platform (it forces ``distributed_executor_backend=ray``,
which vLLM 0.12's CPU platform rejects); docs/serve.md has the details.

Arguments (the ``args`` of the Serve config's application):

  model               path of the model folder inside the engine container
                      (the read-only model-cache bind), required
  model_id            the name clients use (default: the folder's name)
  engine_kwargs       `vllm serve` options, by their names with `_` or `-`
                      (max_model_len, dtype, runner: pooling for an
                      embedding model, ...); true is the bare flag, false
                      its --no- form, lists and dicts are passed as JSON
  deployment_config   Serve options of the deployment (num_replicas,
                      ray_actor_options, health_check_timeout_s, ...);
                      max_ongoing_requests defaults to twice the engine's
                      max_num_seqs (Serve's own default, 5, starves the
                      engine's batch)
"""

import contextlib
import json
import os
import shutil

from ray import serve

# Engine arguments that differ from vLLM's defaults in a CPU engine image:
# float32 (what the CPU kernels and a reference decode agree on), and no
# torch.compile of the model (inductor needs a C++ compiler, which the image
# does not carry; see also TORCHDYNAMO_DISABLE below).
CPU_ENGINE_DEFAULTS = {"dtype": "float32", "enforce_eager": True}
# The parsed `vllm serve` arguments of this replica, handed from the
# deployment's constructor to the ASGI app builder (both run in the replica,
# one after the other; Serve calls the builder without arguments). Both reach
# it through the imported module: Serve pickles the deployment class by
# value, with a copy of this module's globals.
_REPLICA_ARGS = {}


def _replica_args():
    from serve.vllm import openai_app

    return openai_app._REPLICA_ARGS


def require_vllm(version: str, module: str):
    """Fails the application's build, naming both, unless this image's vLLM
    is ``version`` (a per-version module deployed in another engine image)."""
    import vllm

    if vllm.__version__.split("+")[0] != version:
        raise RuntimeError(f"{module} needs vLLM {version}; this image has {vllm.__version__}")


def engine_header():
    """The ``x-argus-engine`` response header's value: the engine image's
    name, version and flavour as its tag states them (Dockerfile.engine-vllm
    sets them), so a client or an operator sees which image answered."""
    name = os.environ.get("ARGUS_ENGINE_NAME", "vllm")
    version = os.environ.get("ARGUS_ENGINE_VERSION", "unknown")
    return f"{name}/{version}-{flavour()}"


def flavour():
    """Returns the engine image's flavour, "cpu" or "gpu" (Dockerfile.engine-vllm)."""
    return os.environ.get("ARGUS_ENGINE_FLAVOUR", "gpu")


def cli_args(args: dict):
    """Returns the `vllm serve` command-line arguments of the app's ``args``."""
    args = dict(args or {})
    model = args.pop("model", None)
    if not model:
        raise ValueError("args.model: the path of the model folder is required")
    model_id = args.pop("model_id", None) or os.path.basename(os.path.normpath(model))
    engine = dict(CPU_ENGINE_DEFAULTS if flavour() == "cpu" else {})
    engine.update(args.pop("engine_kwargs", None) or {})
    args.pop("deployment_config", None)
    if args:
        raise ValueError(f"unknown args: {sorted(args)}")
    out = ["--model", model, "--served-model-name", model_id,
           "--middleware", "serve.vllm.openai_app.EngineHeader"]
    for key, value in engine.items():
        flag = "--" + key.replace("_", "-")
        if value is True:
            out.append(flag)
        elif value is False:
            out.append("--no-" + flag[2:])
        elif isinstance(value, (dict, list)):
            out += [flag, json.dumps(value)]
        elif value is not None:
            out += [flag, str(value)]
    return out


def _build_vllm_app():
    """ASGI app builder (run by Serve in the replica after the constructor):
    vLLM's OpenAI app, whose lifespan starts the engine on the model and
    fills the app's state as `vllm serve` does."""
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.entrypoints.openai.api_server import (
        build_app,
        build_async_engine_client_from_engine_args,
        init_app_state,
    )

    args = _replica_args()["args"]
    app = build_app(args)
    vllm_lifespan = app.router.lifespan_context

    @contextlib.asynccontextmanager
    async def lifespan(a):
        engine_args = AsyncEngineArgs.from_cli_args(args)
        async with build_async_engine_client_from_engine_args(
            engine_args, disable_frontend_multiprocessing=True
        ) as engine:
            await init_app_state(engine, a.state, args)
            async with vllm_lifespan(a):
                yield

    app.router.lifespan_context = lifespan
    return app


class EngineHeader:
    """ASGI middleware: adds ``x-argus-engine`` to every HTTP answer's
    headers (streamed ones too; pure ASGI, so vLLM still sees a client that
    goes away). Given to vLLM's app builder as ``--middleware`` (vLLM's own
    way to add one: its app has built its middleware stack when
    ``build_app`` returns)."""

    def __init__(self, app):
        self.app = app
        self.value = engine_header().encode()

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)

        async def send_named(message):
            if message["type"] == "http.response.start":
                headers = list(message.get("headers") or []) + [(b"x-argus-engine", self.value)]
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, send_named)


@serve.deployment(name="VllmOpenAI", health_check_timeout_s=60)
@serve.ingress(_build_vllm_app)
class VllmOpenAI:
    """A replica: one vLLM engine and its OpenAI routes."""

    def __init__(self, argv: list):
        from vllm.entrypoints.openai.cli_args import (
            make_arg_parser,
            validate_parsed_serve_args,
        )
        from vllm.utils.argparse_utils import FlexibleArgumentParser

        if flavour() == "cpu" and shutil.which(os.environ.get("CXX", "g++")) is None:
            # torch.compile'd helpers (vLLM's sampler has some) need a C++
            # compiler on CPU; without one they run eagerly. The engine core
            # process inherits this.
            os.environ.setdefault("TORCHDYNAMO_DISABLE", "1")
        args = make_arg_parser(FlexibleArgumentParser()).parse_args(argv)
        validate_parsed_serve_args(args)
        _replica_args()["args"] = args


# What this module calls in vLLM: (module, name, parameters it passes).
ENTRY_POINTS = (
    ("vllm.engine.arg_utils", "AsyncEngineArgs", ()),
    ("vllm.entrypoints.openai.api_server", "build_app", ("args",)),
    ("vllm.entrypoints.openai.api_server", "build_async_engine_client_from_engine_args",
     ("engine_args", "disable_frontend_multiprocessing")),
    ("vllm.entrypoints.openai.api_server", "init_app_state", ("engine_client", "state", "args")),
    ("vllm.entrypoints.openai.cli_args", "make_arg_parser", ("parser",)),
    ("vllm.entrypoints.openai.cli_args", "validate_parsed_serve_args", ("args",)),
    ("vllm.utils.argparse_utils", "FlexibleArgumentParser", ()),
)


def check_entry_points():
    """Fails, naming it, when this image's vLLM lacks an entry point this
    module calls or one no longer takes the parameters it is given, or its
    `vllm serve` parser has no ``--middleware`` (run at the engine image's
    build, where no GPU is needed)."""
    import importlib
    import inspect

    import vllm

    for module, name, params in ENTRY_POINTS:
        obj = getattr(importlib.import_module(module), name, None)
        if obj is None:
            raise SystemExit(f"vLLM {vllm.__version__} has no {module}.{name}")
        have = inspect.signature(obj).parameters
        missing = [p for p in params if p not in have]
        if missing:
            raise SystemExit(f"vLLM {vllm.__version__}: {module}.{name} takes no {', '.join(missing)}")
    # The `vllm serve` options are FrontendArgs' fields (parsing them needs a
    # device, which a GPU image's build has not).
    from vllm.entrypoints.openai.cli_args import FrontendArgs

    if "middleware" not in getattr(FrontendArgs, "__dataclass_fields__", {}):
        raise SystemExit(f"vLLM {vllm.__version__}: `vllm serve` has no --middleware")
    print(f"serve.vllm.openai_app: vLLM {vllm.__version__} has every entry point it calls")


# vLLM's own default batch (`--max-num-seqs`) when the endpoint sets none.
VLLM_DEFAULT_MAX_NUM_SEQS = 256


def max_ongoing_requests(args: dict) -> int:
    """Requests a replica takes at once unless the deployment says
    otherwise: twice the engine's batch (`max_num_seqs`), so that the engine
    batches every stream it can hold and has the next ones queued. Serve's
    own default is 5, which made a replica answer at most 5 streams at a
    time whatever the engine could batch: through the lb, 32 concurrent
    streams got 0.29 of the tokens/s of vLLM's own server, the others
    waiting in the proxy (scripts/bench-engine.sh --stream)."""
    engine = (args or {}).get("engine_kwargs") or {}
    seqs = engine.get("max_num_seqs", engine.get("max-num-seqs")) or VLLM_DEFAULT_MAX_NUM_SEQS
    return 2 * int(seqs)


def build_app(args: dict):
    """Returns the Serve application for ``args`` (see the module doc)."""
    options = dict((args or {}).get("deployment_config") or {})
    options.setdefault("max_ongoing_requests", max_ongoing_requests(args))
    return VllmOpenAI.options(**options).bind(cli_args(args))
