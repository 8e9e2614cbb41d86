"""Built-in models: the wheels' files are checked by sha256, and concurrent preparation on one
node converts once (file lock) while every caller gets a complete folder."""

import hashlib
import json
import os
import subprocess
import sys

import pytest

from ctxpick.engines.models import (
    BUILTINS,
    BuiltinModel,
    ModelChecksumError,
    _package_files,
    check_files,
)


def test_a_changed_wheel_file_is_refused_by_name(tmp_path):
    good, bad = tmp_path / "part01.bin", tmp_path / "part02.bin"
    good.write_bytes(b"weights")
    bad.write_bytes(b"tampered")
    digest = hashlib.sha256(b"weights").hexdigest()
    model = BuiltinModel("m", "org/m", ("pkg",), "*.bin", (digest, digest))
    check_files(model, [good, good])
    with pytest.raises(ModelChecksumError, match=r"part02\.bin has sha256 .* expected"):
        check_files(model, [good, bad])
    with pytest.raises(ModelChecksumError, match="1 files found, 2 expected"):
        check_files(model, [good])


@pytest.mark.parametrize("alias", list(BUILTINS))
def test_installed_wheels_match_their_pinned_checksums(alias):
    check_files(BUILTINS[alias], _package_files(BUILTINS[alias]))


PREPARE = """
import json, sys, time
from ctxpick.engines import models
calls = []
convert = models._convert
models._convert = lambda *a: calls.append(time.time()) or convert(*a)
path = models.prepare("smollm2-135m")
print(json.dumps({"path": str(path), "converted": len(calls)}))
"""


@pytest.mark.slow
def test_concurrent_prepare_converts_once(tmp_path):
    """Two processes (as two actors on one node) prepare the same model at once."""
    env = {**os.environ, "CTXPICK_CACHE": str(tmp_path)}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", PREPARE], env=env, stdout=subprocess.PIPE, text=True
        )
        for _ in range(2)
    ]
    results = [json.loads(p.communicate(timeout=600)[0].strip().splitlines()[-1]) for p in procs]
    assert all(p.returncode == 0 for p in procs)
    assert results[0]["path"] == results[1]["path"]
    assert sorted(r["converted"] for r in results) == [0, 1]  # one converted, one waited
    folder = tmp_path / "models" / "smollm2-135m"
    assert (folder / "config.json").exists() and any(folder.glob("*.safetensors"))
    assert not (tmp_path / "models" / "smollm2-135m.partial").exists()
