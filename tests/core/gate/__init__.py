"""Tests of aieng_core.gate: the promotion gate run for real on the tiny bundles."""
