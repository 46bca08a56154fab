"""Pickle safety of multi-GPU outputs (issue 16): the DeepSpeed and DCP data records join the allowlist by exact
name, load with weights_only and inert stand-ins (DeepSpeed and Lightning are never imported); `.metadata` goes
through a restricted unpickler; every archive of a `.distcp` is scanned. A payload planted in `.metadata`, in a
DeepSpeed optimizer shard, in a non-first archive of a `.distcp` and in one rank's RNG file is live (a
throwaway child that loads it the way torch or DCP does creates its marker), is IV506 and is never run here."""
from __future__ import annotations

import io
import pickle
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from itera_verify.package.pickles import is_allowed, scan_file
from itera_verify.package.pickles.allowlist import DCP_RECORDS, DEEPSPEED_RECORDS
from itera_verify.package.pickles.distcp import Window, split_archives
from itera_verify.reload.records import read_metadata

from fixtures.artifacts import malicious_pickle
from fixtures.multigpu import ARTIFACTS
from tests import zip_forms
from tests.helpers import static_findings
from tests.test_multigpu_reload import DCP, DDP, FSDP, ZERO2, reload

ROOT = Path(__file__).resolve().parents[1]


def payload(marker: Path) -> bytes:
    """builtins.open(marker, 'w'): a pickle whose only effect is the marker file."""
    return b"\x80\x02cbuiltins\nopen\n(" + b"S" + repr(str(marker)).encode() + b"\nS'w'\ntR."


def live(code: str, marker: Path) -> bool:
    """Run `code` (the way a reviewer's tools load the file) in a throwaway child; did the marker appear?"""
    subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, timeout=120, check=False,
                   env={"PYTHONPATH": str(ROOT / "validator"), "PATH": "/usr/bin:/bin"})
    appeared = marker.exists()
    marker.unlink(missing_ok=True)
    return appeared


def iv506_paths(package_dir: Path) -> dict[str, str]:
    return {f.path: f.message for f in static_findings(package_dir) if f.code == "IV506"}


def assert_refused(package_dir, built_multigpu, rel: str, artifact: str, marker: Path) -> None:
    assert rel in iv506_paths(package_dir) and "open" in iv506_paths(package_dir)[rel]
    results, _ = reload(package_dir, built_multigpu["hf_cache"], artifact)
    assert not results[artifact].ok and "IV506" in results[artifact].error
    assert not marker.exists()


# --- the allowlist: exact names ----------------------------------------------------------------------

def test_deepspeed_and_dcp_records_are_allowed_by_exact_name_only():
    for name in DEEPSPEED_RECORDS | DCP_RECORDS:
        assert is_allowed(name)
    for name in ("deepspeed.runtime.engine.DeepSpeedEngine", "deepspeed.runtime.fp16.loss_scaler.to_python_float",
                 "deepspeed.utils.tensor_fragment.fragment_address.__init__", "torch.distributed.checkpoint.load",
                 "torch.distributed.checkpoint.metadata.os", "pathlib.Path.write_text", "pathlib.WindowsPath"):
        assert not is_allowed(name), name


def test_real_shards_and_metadata_name_only_allowlisted_records(built_multigpu):
    package = Path(built_multigpu["package"])
    shard = scan_file(package / ZERO2 / "global_step2/zero_pp_rank_0_mp_rank_00_optim_states.pt")
    assert DEEPSPEED_RECORDS - {"deepspeed.runtime.fp16.loss_scaler.DynamicLossScaler"} <= shard.globals
    assert shard.loadable and not shard.unsafe
    metadata = scan_file(package / FSDP / "optimizer_0/.metadata")
    assert "pathlib.PosixPath" in metadata.globals and metadata.loadable
    distcp = scan_file(package / DCP / "__0_0.distcp")
    assert distcp.loadable and distcp.error is None


def test_every_archive_of_a_real_distcp_is_an_item_of_its_metadata(built_multigpu):
    folder = Path(built_multigpu["package"]) / FSDP / "optimizer_0"
    stored = {(i.relative_path, i.offset, i.length)
              for i in read_metadata((folder / ".metadata").read_bytes()).storage_data.values()}
    for path in sorted(folder.glob("*.distcp")):
        with open(path, "rb") as fh:
            archives = split_archives(fh, path.stat().st_size)
        assert len(archives) > 3 and {(path.name, start, length) for start, length in archives} <= stored


def test_verifying_never_imports_deepspeed_or_lightning(built_multigpu, tmp_path):
    """The tool's loaders, run in a process where importing DeepSpeed or Lightning fails."""
    package = built_multigpu["package"]
    code = f"""
        import sys
        for name in ("deepspeed", "lightning", "pytorch_lightning", "lightning_fabric"):
            sys.modules[name] = None  # any import of them raises ImportError
        import torch
        import itera_verify.cli
        from itera_verify.reload.common import Outcome
        from itera_verify.reload.loaders import LOADERS, loader_module
        for loader, path, config in {[(v[0], v[1], v[2].get("config")) for v in ARTIFACTS.values()]!r}:
            job = {{"loader": loader, "path": {package!r} + "/" + path, "package_root": {package!r},
                   "config": config and {package!r} + "/" + config}}
            outcome = Outcome(job)
            loader_module(loader).reload(job, torch.device("cpu"), outcome)
            assert outcome.ok, (loader, outcome.problems)
        print("ok", sorted(LOADERS))
    """
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          timeout=300, check=False, env={"PYTHONPATH": str(ROOT / "validator"), "PATH": "/usr/bin:/bin",
                                            "HF_HUB_OFFLINE": "1"})
    assert done.returncode == 0 and "ok" in done.stdout, done.stderr[-2000:]


# --- the restricted unpickler for .metadata ----------------------------------------------------------

def test_metadata_unpickler_refuses_what_plain_pickle_would_run(tmp_path):
    marker = tmp_path / "marker"
    with pytest.raises(pickle.UnpicklingError):
        read_metadata(payload(marker))
    with pytest.raises(pickle.UnpicklingError):  # a tensor rebuild is not a metadata record
        read_metadata(pickle.dumps(torch._utils._rebuild_tensor_v2))
    assert not marker.exists()


# --- payloads in each location -----------------------------------------------------------------------

def test_payload_in_dcp_metadata_is_IV506_and_never_runs(multigpu_dir, built_multigpu, tmp_path):
    marker = tmp_path / "metadata-marker"
    metadata = multigpu_dir / FSDP / "optimizer_0/.metadata"
    metadata.write_bytes(payload(marker))
    # torch's own reader runs it: FileSystemReader.read_metadata is plain pickle.load
    assert live(f"""
        from torch.distributed.checkpoint import FileSystemReader
        FileSystemReader({str(metadata.parent)!r}).read_metadata()""", marker)
    assert_refused(multigpu_dir, built_multigpu, f"{FSDP}/optimizer_0/.metadata", "fsdp-checkpoint", marker)


def test_payload_in_a_deepspeed_optimizer_shard_is_IV506_and_never_runs(multigpu_dir, built_multigpu, tmp_path):
    marker = tmp_path / "shard-marker"
    rel = f"{ZERO2}/global_step2/zero_pp_rank_1_mp_rank_00_optim_states.pt"
    shard = multigpu_dir / rel
    shard.write_bytes(zip_forms.with_data_pkl(shard.read_bytes(), payload(marker)))
    assert live(f"import torch; torch.load({str(shard)!r}, weights_only=False)", marker)  # what zero_to_fp32 does
    assert_refused(multigpu_dir, built_multigpu, rel, "zero2-checkpoint", marker)


def test_payload_in_a_non_first_archive_of_a_distcp_is_IV506_and_never_runs(multigpu_dir, built_multigpu,
                                                                            tmp_path):
    marker = tmp_path / "distcp-marker"
    rel = f"{DCP}/__1_0.distcp"
    path = multigpu_dir / rel
    data = path.read_bytes()
    with open(path, "rb") as fh:
        archives = split_archives(fh, len(data))
    start, length = archives[2]
    poisoned = zip_forms.with_data_pkl(data[start:start + length], payload(marker))
    path.write_bytes(data[:start] + poisoned + data[start + length:])
    assert live(f"""
        import io, torch
        data = open({str(path)!r}, "rb").read()[{start}:{start + len(poisoned)}]
        torch.load(io.BytesIO(data), weights_only=False)  # DCP's load_bytes does this for non-tensor items""",
                marker)
    with open(path, "rb") as fh:  # the file still splits: the payload is in its third archive, not at its start
        assert len(split_archives(fh, path.stat().st_size)) == len(archives)
    assert_refused(multigpu_dir, built_multigpu, rel, "dcp-model", marker)


def test_payload_in_one_ranks_rng_file_is_IV506_and_never_runs(multigpu_dir, built_multigpu, tmp_path):
    marker = tmp_path / "rng-marker"
    rel = f"{DDP}/rng_state_1.pth"
    malicious_pickle(multigpu_dir / rel, marker, via="open", fmt="torch")
    assert live(f"import torch; torch.load({str(multigpu_dir / rel)!r}, weights_only=False)", marker)
    assert_refused(multigpu_dir, built_multigpu, rel, "ddp-checkpoint", marker)


def test_a_distcp_archive_cut_in_its_middle_is_refused(built_multigpu, tmp_path):
    source = Path(built_multigpu["package"]) / DCP / "__0_0.distcp"
    data = source.read_bytes()
    with open(source, "rb") as fh:
        start, length = split_archives(fh, len(data))[1]
    broken = tmp_path / "__0_0.distcp"
    broken.write_bytes(data[:start + length // 2] + data[start + length:])
    result = scan_file(broken)
    assert not result.loadable and "archive" in result.error


def test_a_distcp_window_reads_like_torchs_reader_view(built_multigpu):
    path = Path(built_multigpu["package"]) / DCP / "__0_0.distcp"
    with open(path, "rb") as fh:
        start, length = split_archives(fh, path.stat().st_size)[0]
        from_window = torch.load(Window(fh, start, length), weights_only=True)
    from_bytes = torch.load(io.BytesIO(path.read_bytes()[start:start + length]), weights_only=True)
    assert torch.equal(from_window, from_bytes)
