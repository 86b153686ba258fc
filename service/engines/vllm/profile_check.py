"""Checking a deployment profile offline against vLLM's own code (``hallmark deploy check``).

Per node, in order, each step with vLLM's own message on failure:

1. vLLM's ``vllm serve`` argument parser (``make_arg_parser``), including its ``--config``
   handling of the engine-key file: unknown options, bad values and choices;
2. ``validate_parsed_serve_args`` and ``AsyncEngineArgs.from_cli_args``;
3. the configs vLLM can build without the model or a GPU: ``WatermarkConfig``,
   ``ParallelConfig`` (TP / PCP / DCP / EP arithmetic), ``SpeculativeConfig``'s fields,
   the watermark-with-speculation rules (``VllmConfig._check_supports_watermarking``) and
   Model Runner V2's prefill-context-parallel rules (``PCPManager.validate_config``), fed
   with the profile's ``model_facts`` in place of the checkpoint's config.json;
4. rules that vLLM applies only when the attention backend starts (sparse-MLA decode
   context parallelism, ``flashmla_sparse.py``), mirrored here with vLLM's messages;
5. the profile's own arithmetic: ranks x GPUs, the watermark mode's requirements.

What needs the real checkpoint or GPUs (quantisation kernels, memory fit) is not checked;
deploy/README.md gives that arithmetic per profile.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from service.engines.vllm.engine_key import read_engine_config, vllm_config_text
from service.engines.vllm.profiles import Profile, launch_commands, node_argv
from watermark.key import WatermarkKey
from watermark.spec import WatermarkSpec

# The key a check parses when the real engine-key file is not at hand.
PLACEHOLDER_KEY = WatermarkKey(secret=1, spec=WatermarkSpec(algorithm="dual_key_gumbel"))
# vLLM's threshold for the mixed-batch fp8 sparse path (flashmla_sparse.py).
MIN_HEADS_FOR_BF16_PREFILL = 32
_FP8_DS_MLA = ("fp8", "fp8_ds_mla")


@dataclass(frozen=True)
class CheckResult:
    profile: str
    ok: bool
    commands: list[str]
    problems: list[str] = field(default_factory=list)
    checks: list[str] = field(default_factory=list)
    """What was checked, in order (for the report)."""

    def to_dict(self) -> dict[str, Any]:
        return {"profile": self.profile, "ok": self.ok, "commands": self.commands,
                "problems": self.problems, "checks": self.checks}


class _Problem(Exception):
    """One failed step; the message is the one to show."""


def _quiet_vllm() -> None:
    # vLLM logs to stdout by default, which would mix with `--json` output.
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")


def _first_error_line(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    for line in reversed(lines):
        if "error:" in line:
            return line.split("error:", 1)[1].strip()
    return lines[-1] if lines else "rejected"


def _message(exc: BaseException) -> str:
    """vLLM's message: a pydantic error's messages (without pydantic's decoration), or str()."""
    from pydantic import ValidationError

    if isinstance(exc, ValidationError):
        from watermark.validation import error_lines

        return "; ".join(error_lines(exc, default="", plain=True))
    return str(exc).strip()


def _serve_args_module():
    """vLLM's ``vllm serve`` argument module: ``entrypoints.launchers.cli_args`` in 0.32,
    ``entrypoints.common.cli_args`` in 0.34."""
    try:
        from vllm.entrypoints.launchers import cli_args
    except ImportError:  # vLLM 0.34
        from vllm.entrypoints.common import cli_args
    return cli_args


def _parse(argv: list[str]):
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    cli_args = _serve_args_module()
    make_arg_parser, validate_parsed_serve_args = cli_args.make_arg_parser, cli_args.validate_parsed_serve_args

    parser = make_arg_parser(FlexibleArgumentParser(prog="vllm serve"))
    captured = io.StringIO()
    try:
        with contextlib.redirect_stderr(captured), contextlib.redirect_stdout(io.StringIO()):
            args = parser.parse_args(argv)
    except SystemExit:
        raise _Problem(f"vLLM's argument parser: {_first_error_line(captured.getvalue())}") from None
    except (ValueError, TypeError) as exc:
        raise _Problem(f"vLLM's argument parser: {_message(exc)}") from None
    try:
        validate_parsed_serve_args(args)
        engine_args = AsyncEngineArgs.from_cli_args(args)
    except (ValueError, TypeError) as exc:
        raise _Problem(f"vLLM's EngineArgs: {_message(exc)}") from None
    return args, engine_args


def _parallel_config(engine_args):
    from vllm.config import ParallelConfig

    try:
        config = ParallelConfig(
            pipeline_parallel_size=engine_args.pipeline_parallel_size,
            tensor_parallel_size=engine_args.tensor_parallel_size,
            prefill_context_parallel_size=engine_args.prefill_context_parallel_size,
            decode_context_parallel_size=engine_args.decode_context_parallel_size,
            data_parallel_size=engine_args.data_parallel_size,
            enable_expert_parallel=engine_args.enable_expert_parallel,
            nnodes=engine_args.nnodes, node_rank=engine_args.node_rank,
            master_addr=engine_args.master_addr, master_port=engine_args.master_port,
            dcp_comm_backend=engine_args.dcp_comm_backend, dcp_q_replicate=engine_args.dcp_q_replicate,
            distributed_executor_backend=engine_args.distributed_executor_backend,
        )
    except (ValueError, TypeError) as exc:
        raise _Problem(f"vLLM's ParallelConfig: {_message(exc)}") from None
    # What VllmConfig does next for models that state no preference (config/vllm.py).
    config.set_dcp_defaults()
    return config


class _SpeculativeView(SimpleNamespace):
    """A speculative config with the profile's model facts standing in for the draft
    checkpoint; its predicates are vLLM's own methods (any other method or property of
    vLLM's ``SpeculativeConfig`` that a rule calls runs on this view: vLLM 0.34 asks more)."""

    def __getattr__(self, name: str):
        import types

        from vllm.config import SpeculativeConfig

        member = getattr(SpeculativeConfig, name, None)
        if isinstance(member, property) and member.fget is not None:
            return member.fget(self)
        if callable(member) and not isinstance(member, type):
            return types.MethodType(member, self)
        raise AttributeError(name)

    def use_dspark(self) -> bool:
        from vllm.config import SpeculativeConfig

        return SpeculativeConfig.use_dspark(self)

    def use_multi_module_mtp(self) -> bool:
        from vllm.config import SpeculativeConfig

        return SpeculativeConfig.use_multi_module_mtp(self)

    @property
    def speculator_config(self):
        """vLLM 0.34's per-method speculator config over this view, as its ``SpeculativeConfig``
        builds it (the watermark and PCP rules ask it)."""
        from vllm.v1.worker.gpu.spec_decode.speculator_config import get_speculator_config_class

        return get_speculator_config_class(self)(self)


def _speculative_view(options: dict[str, Any] | None, profile: Profile) -> _SpeculativeView | None:
    if not options:
        return None
    from vllm.config import SpeculativeConfig

    try:
        SpeculativeConfig(**options)
    except (ValueError, TypeError) as exc:
        message = _message(exc)
        # Offline there is no target model; every other complaint is the profile's.
        if "target_model_config must be present" not in message:
            raise _Problem(f"vLLM's SpeculativeConfig: {message}") from None
    from pydantic.fields import FieldInfo

    defaults = {}
    for name, spec_field in SpeculativeConfig.__dataclass_fields__.items():
        default = spec_field.default
        if isinstance(default, FieldInfo):
            default = default.default
        if default is not dataclasses.MISSING:
            defaults[name] = default
    draft = SimpleNamespace(hf_config=SimpleNamespace(num_nextn_predict_layers=profile.model_facts.mtp_layers),
                            use_mla=profile.model_facts.use_mla)
    return _SpeculativeView(**{**defaults, **options, "draft_model_config": draft})


def _check_watermark(engine_args, speculative: _SpeculativeView | None):
    from vllm.config import VllmConfig

    try:
        watermark = engine_args.create_watermark_config()
    except (ValueError, TypeError) as exc:
        raise _Problem(f"vLLM's WatermarkConfig: {_message(exc)}") from None
    if watermark is not None:
        try:
            VllmConfig._check_supports_watermarking(
                SimpleNamespace(watermark_config=watermark, speculative_config=speculative))
        except (ValueError, TypeError) as exc:
            raise _Problem(f"vLLM's watermark rules: {_message(exc)}") from None
    return watermark


def _cudagraph_mode(engine_args):
    from vllm.config.compilation import CUDAGraphMode

    if engine_args.enforce_eager:
        return CUDAGraphMode.NONE
    compilation = engine_args.compilation_config
    mode = getattr(compilation, "cudagraph_mode", None)
    if isinstance(mode, str):
        return CUDAGraphMode[mode.upper()]
    return mode if mode is not None else CUDAGraphMode.FULL_AND_PIECEWISE  # vLLM's CUDA default


def _check_pcp(engine_args, parallel, speculative, profile: Profile) -> None:
    if parallel.prefill_context_parallel_size <= 1:
        return
    from vllm.v1.worker.gpu.pcp_manager import PCPManager

    facts = profile.model_facts
    text_config = SimpleNamespace(**({"index_topk": 2048} if facts.sparse_mla else {}))
    view = SimpleNamespace(
        parallel_config=parallel,
        model_config=SimpleNamespace(use_mla=facts.use_mla, is_encoder_decoder=False, hf_text_config=text_config),
        lora_config=object() if engine_args.enable_lora else None,
        speculative_config=speculative,
        compilation_config=SimpleNamespace(cudagraph_mode=_cudagraph_mode(engine_args)),
    )
    try:
        PCPManager.validate_config(view, supports_mm_inputs=False)
    except (NotImplementedError, ValueError) as exc:
        raise _Problem(f"vLLM's prefill-context-parallel rules (Model Runner V2): {exc}") from None


def _check_sparse_mla_dcp(engine_args, parallel, profile: Profile) -> None:
    """vLLM 0.32's FlashMLA-sparse rules for DCP (FlashMLASparseImpl.__init__ in
    vllm/v1/attention/backends/mla/flashmla_sparse.py; FlashAttention's sparse MLA backend
    refuses DCP altogether), which it applies only once the GPUs start."""
    if not profile.model_facts.sparse_mla or parallel.decode_context_parallel_size <= 1:
        return
    if parallel.dcp_comm_backend != "ag_rs":
        raise _Problem("vLLM's sparse-MLA rules: DCP for FlashMLA sparse is only validated with the "
                       f"default 'ag_rs' DCP comm backend; got '{parallel.dcp_comm_backend}'")
    cache_dtype = engine_args.kv_cache_dtype
    if parallel.prefill_context_parallel_size > 1:
        if cache_dtype not in _FP8_DS_MLA:
            raise _Problem("vLLM's sparse-MLA rules: PCP+DCP sparse prefill gathers the KV through the "
                           f"fp8_ds_mla upconvert; got a {cache_dtype} cache (set kv-cache-dtype: fp8)")
        return
    heads = profile.model_facts.attention_heads // parallel.tensor_parallel_size
    if heads >= MIN_HEADS_FOR_BF16_PREFILL:
        raise _Problem("vLLM's sparse-MLA rules: DCP for FlashMLA sparse is only supported on the "
                       f"mixed-batch fp8 path (num_heads < {MIN_HEADS_FOR_BF16_PREFILL}); this layout has "
                       f"{heads} heads per rank")


def _check_layout(parallel, profile: Profile, rank: int) -> None:
    hardware = profile.hardware
    ranks = parallel.world_size * parallel.data_parallel_size
    gpus = hardware.nodes * hardware.gpus_per_node
    if ranks != gpus:
        raise _Problem(f"the layout uses {ranks} GPUs (TP {parallel.tensor_parallel_size} x PP "
                       f"{parallel.pipeline_parallel_size} x PCP {parallel.prefill_context_parallel_size} x DP "
                       f"{parallel.data_parallel_size}) but the hardware has {gpus}")
    if parallel.nnodes != hardware.nodes:
        raise _Problem(f"nnodes is {parallel.nnodes} but the hardware has {hardware.nodes} node(s)")
    if hardware.nodes > 1 and parallel.node_rank != rank:
        raise _Problem(f"node entry {rank} sets node-rank {parallel.node_rank}")


def _check_mode(profile: Profile, speculative, watermark) -> None:
    if profile.watermark == "plugin":
        if speculative is not None:
            try:
                from vllm.v1.sample.logits_processor import STR_SPEC_DEC_REJECTS_LOGITSPROCS as reason
            except ImportError:  # vLLM 0.34 has no such constant; its rule is the same
                reason = "Custom logits processors are not supported when speculative decoding is enabled."
            raise _Problem(f"vLLM: {reason} Use watermark: engine-key for speculative decoding.")
    elif watermark is None or watermark.algorithm != "dual_key_gumbel":
        raise _Problem("the engine-key mode needs the dual_key_gumbel watermark from the engine key file")


def _scrub(text: str, key: WatermarkKey | None) -> str:
    """Remove the engine key from a message (vLLM may quote option values back)."""
    if key is None:
        return text
    for form in (str(key.secret), f"{key.secret:#x}", f"{key.secret:016x}"):
        text = text.replace(form, "<key>")
    return text


def check_profile(profile: Profile, engine_key_file: Path | None = None) -> CheckResult:
    """Validate every node's ``vllm serve`` command of ``profile`` (see the module docstring).

    ``engine_key_file``: the real ``--config`` file to validate with (permissions and
    content); without it a placeholder key stands in.
    """
    _quiet_vllm()
    commands = launch_commands(profile)
    checks: list[str] = []
    real_key: WatermarkKey | None = None
    with tempfile.TemporaryDirectory(prefix="hallmark-deploy-check-") as scratch:
        key_file: str | None = None
        try:
            if profile.watermark == "engine-key":
                if engine_key_file is not None:
                    real_key = read_engine_config(engine_key_file)
                    key_file = str(engine_key_file)
                    checks.append(f"engine key file {engine_key_file}: mode 0600, vLLM watermark config")
                else:
                    key_file = str(Path(scratch) / "engine-key.yaml")
                    Path(key_file).write_text(vllm_config_text(PLACEHOLDER_KEY), encoding="utf-8")
            for rank in range(profile.hardware.nodes):
                argv = node_argv(profile, rank, key_file=key_file)
                _, engine_args = _parse(argv)
                parallel = _parallel_config(engine_args)
                speculative = _speculative_view(engine_args.speculative_config, profile)
                watermark = _check_watermark(engine_args, speculative)
                _check_pcp(engine_args, parallel, speculative, profile)
                _check_sparse_mla_dcp(engine_args, parallel, profile)
                _check_layout(parallel, profile, rank)
                _check_mode(profile, speculative, watermark)
                checks.append(
                    f"node {rank}: vLLM parser and EngineArgs, ParallelConfig (world size "
                    f"{parallel.world_size}, TP {parallel.tensor_parallel_size}, PCP "
                    f"{parallel.prefill_context_parallel_size}, DCP {parallel.decode_context_parallel_size}, "
                    f"EP {'on' if parallel.enable_expert_parallel else 'off'}), "
                    + ("WatermarkConfig " + watermark.algorithm if watermark else "per-request plugin")
                    + (f", speculative {speculative.method} x{speculative.num_speculative_tokens}"
                       if speculative else "")
                )
        except _Problem as problem:
            return CheckResult(profile=profile.name, ok=False, commands=commands,
                               problems=[_scrub(str(problem), real_key)], checks=checks)
        except ValueError as exc:  # an unreadable engine key file
            return CheckResult(profile=profile.name, ok=False, commands=commands,
                               problems=[_scrub(str(exc), real_key)], checks=checks)
    return CheckResult(profile=profile.name, ok=True, commands=commands, checks=checks)
