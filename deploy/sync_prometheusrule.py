#!/usr/bin/env python3
"""Regenerate deploy/k8s/prometheusrule.yaml from deploy/prometheus/alerts.yml.

The alert rules live once, in alerts.yml (Prometheus's own format, checked by promtool); the
Prometheus Operator needs the same groups wrapped in a PrometheusRule. Run after editing
alerts.yml: ``python deploy/sync_prometheusrule.py``. tests/test_deploy_static.py fails when
the two disagree.
"""

from __future__ import annotations

from pathlib import Path

import yaml

DEPLOY = Path(__file__).resolve().parent
ALERTS = DEPLOY / "prometheus" / "alerts.yml"
PROMETHEUS_RULE = DEPLOY / "k8s" / "prometheusrule.yaml"

HEADER = """\
# GENERATED from deploy/prometheus/alerts.yml by deploy/sync_prometheusrule.py: edit alerts.yml,
# then run `python deploy/sync_prometheusrule.py`. The alert rules for the Prometheus Operator.
"""


class _BlockStrings(yaml.SafeDumper):
    """Dump multi-line PromQL as literal blocks so the generated file stays readable."""


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_BlockStrings.add_representer(str, _str)


def render() -> str:
    groups = yaml.safe_load(ALERTS.read_text())["groups"]
    rule = {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": {"name": "pandora", "labels": {"release": "kube-prometheus-stack"}},
        "spec": {"groups": groups},
    }
    return HEADER + yaml.dump(rule, Dumper=_BlockStrings, sort_keys=False, width=100)


if __name__ == "__main__":
    PROMETHEUS_RULE.write_text(render())
    print(f"wrote {PROMETHEUS_RULE}")
