"""The fixtures shipped for plugin authors (``reef_core.testing.pytest_plugin``) work as documented."""

from __future__ import annotations

from reef_core.testing import system_prompt


def test_factories_start_and_wire(fake_upstream, reef_server):
    up = fake_upstream("anthropic", lambda body: f"system was: {system_prompt(body)}")
    reef = reef_server(upstream=up, tokens=[{"token": "t", "role": "admin"}], token="t")
    msg = reef.anthropic().messages.create(model="m", max_tokens=5, system="S",
                                           messages=[{"role": "user", "content": "hi"}])
    assert msg.content[0].text == "system was: S"
    second = reef_server(upstream=up)
    assert second.url != reef.url and second.settings.state_dir != reef.settings.state_dir
