"""Shared fixtures: configs from presets and small helpers to read rendered Dockerfiles."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from kit import config as cfg
from kit import rules

ROOT = Path(__file__).resolve().parent.parent
GOLDEN = ROOT / "tests" / "golden"
# Golden files must not depend on the machine that renders them: fix the build host.
FIXED_HOST = {"build": {"cpus": 8, "memory_gib": 16}}


def make_config(data: dict[str, Any] | None = None) -> cfg.StackConfig:
    config = cfg.from_dict(cfg.deep_merge(FIXED_HOST, data or {}))
    rules.validate(config)
    return config


@pytest.fixture
def configure():
    return make_config


def stages(dockerfile: str) -> dict[str, str]:
    """Stage name -> its text (from its FROM line up to the next FROM)."""
    parts = re.split(r"^(?=FROM )", dockerfile, flags=re.M)
    out = {}
    for part in parts:
        match = re.match(r"FROM \S+ AS (\S+)", part)
        if match:
            out[match.group(1)] = part
    return out


def nccl_versions(stage_text: str) -> set[str]:
    found = set(re.findall(r"libnccl(?:2|-dev)=([0-9.]+)-1\+cuda", stage_text))
    found |= set(re.findall(r"nvidia-nccl-cu12==([0-9.]+)", stage_text))
    found |= set(re.findall(r"nccl-check\.sh \w+ ([0-9.]+)", stage_text))
    return found
