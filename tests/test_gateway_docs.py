"""``--docs/--no-docs``: the OpenAPI schema and docs pages are on by default (no key needed, so
a browser can open them); ``--no-docs`` removes them while the API keeps working."""

from __future__ import annotations

import httpx

BODY = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
DOC_PATHS = ("/openapi.json", "/docs", "/redoc")


def test_docs_on_by_default_even_with_api_keys(gateway_factory):
    server = gateway_factory(api_key=["k"], max_samples=1)
    for path in DOC_PATHS:
        assert httpx.get(server.url + path).status_code == 200, path
    assert "/v1/chat/completions" in httpx.get(server.url + "/openapi.json").json()["paths"]
    assert httpx.post(server.url + "/v1/chat/completions", json=BODY).status_code == 401


def test_no_docs_hides_schema_and_pages(gateway_factory):
    server = gateway_factory(api_key=["k"], docs=False, max_samples=1)
    for path in DOC_PATHS:
        response = httpx.get(server.url + path, headers={"Authorization": "Bearer k"})
        assert response.status_code == 404, path
    chat = httpx.post(
        server.url + "/v1/chat/completions", json=BODY, headers={"Authorization": "Bearer k"}
    )
    assert chat.status_code == 200, chat.text
    assert httpx.get(server.url + "/health").status_code == 200


def test_no_docs_flag_parses(monkeypatch):
    import argparse

    from server.serve_cli import load_settings, register

    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    assert load_settings(parser.parse_args(["serve", "--no-docs"])).docs is False
    assert load_settings(parser.parse_args(["serve"])).docs is True
    monkeypatch.setenv("PANDORA_DOCS", "false")
    assert load_settings(parser.parse_args(["serve"])).docs is False
