"""Test-only entry for a zygote's forked child (tests/test_zygote.py): it reports what the process looks like
at its start and, asked to, leaves changes behind (a patched module attribute, a held tensor, a new module, a
moved RNG) that the next child must not see."""
from __future__ import annotations

import hashlib
import json
import os
import sys


def _state() -> dict:
    import numpy as np
    import torch

    functional = torch.nn.functional
    return {
        "pid": os.getpid(), "ppid": os.getppid(), "sid": os.getsid(0), "pgid": os.getpgid(0),
        "gelu_is_torch": functional.gelu is torch._C._nn.gelu,
        "held_tensor": hasattr(functional, "_itera_probe_tensor"),
        "new_module": "tabnanny" in sys.modules,
        "torch_rng": hashlib.sha256(torch.get_rng_state().numpy().tobytes()).hexdigest(),
        "numpy_rng": hashlib.sha256(np.random.get_state()[1].tobytes()).hexdigest(),
        "cmdline": [a.decode() for a in open("/proc/self/cmdline", "rb").read().split(b"\0") if a],
        "tmpdir": os.environ.get("TMPDIR"), "cwd": os.getcwd(), "variables": sorted(os.environ),
        "modelling_imported": sorted(m for m in ("transformers", "peft", "accelerate") if m in sys.modules),
        "imported": sorted(m for m in WATCHED if sys.modules.get(m) is not None),
        "kept_out": sorted(m for m in WATCHED if m in sys.modules and sys.modules[m] is None),
        "hub_cache": getattr(sys.modules.get("huggingface_hub.constants"), "HF_HUB_CACHE", None),
    }


# Libraries a zygote imports only where its run's loaders need them (itera_verify/reload/preloads.py).
WATCHED = ("transformers", "peft", "accelerate", "bitsandbytes", "boto3", "scipy", "torchvision", "diffusers", "timm",
           "deepspeed", "sentence_transformers", "torch._inductor.compile_fx")


def probe(argv: list[str]) -> int:
    out, action = argv[1], argv[2]
    import numpy as np
    import torch

    report = {"at_start": _state()}
    if action == "mutate":
        torch.nn.functional.gelu = lambda *args, **kwargs: None  # a patched module attribute
        torch.nn.functional._itera_probe_tensor = torch.ones(1 << 24)  # 64 MiB held by a module
        import tabnanny  # noqa: F401 - a module the zygote never imported

        torch.manual_seed(1234)
        torch.rand(5)
        np.random.seed(99)
        report["after"] = _state()
    with open(out, "w", encoding="utf-8") as handle:
        json.dump(report, handle)
    return 0
