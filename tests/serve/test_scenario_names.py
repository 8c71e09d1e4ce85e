"""A scenario's name is a file name in three places (the release chain's git ref, its releases
directory, its learner lineage): every name the server accepts must fit a file name escaped."""

from __future__ import annotations

from urllib.parse import quote

from hypothesis import given
from hypothesis import strategies as st

from reef_core.builtins.git_store import scenario_ref
from reef_core.commit.lineage import _safe
from reef_core.serve.scenarios import is_scenario_name, scenario_name_problem

#: a file name's limit, less the ".lock" git and the lineage put beside or after it
ROOM = 255 - len(".lock")


def test_the_rule():
    assert is_scenario_name("a" * 200) and not is_scenario_name("a" * 201)
    assert is_scenario_name("team:agent.v2") and not is_scenario_name("a/b") and not is_scenario_name("")
    assert not is_scenario_name("a" + "a:" * 90)  # 181 characters, 361 escaped
    assert is_scenario_name("a" + "a:" * 62) and not is_scenario_name("a" + "a:" * 63)  # 249 and 253 escaped
    assert "each '.' and ':' counted as 3" in scenario_name_problem("a" + ":" * 199)


@given(st.text(alphabet="aZ09_-.:", min_size=1, max_size=220))
def test_every_accepted_name_fits_a_file_name_wherever_it_is_one(name):
    if not is_scenario_name(name):
        return
    assert len(scenario_ref(name).rsplit("/", 1)[1]) <= ROOM
    assert len(_safe(name)) <= ROOM
    assert len(quote(name, safe="")) <= ROOM


def test_the_server_refuses_a_name_that_would_not_fit(reefs):
    client = reefs["openai"].client()
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    long_name = "a" + "a:" * 90
    refused = client.post("/v1/chat/completions", json=body, headers={"x-reef-scenario": long_name})
    assert refused.status_code == 400 and "not a valid scenario name" in refused.json()["error"]["message"]
    assert client.get(f"/reef/scenarios/{long_name}/lineage").status_code == 404
    assert client.post("/v1/chat/completions", json=body, headers={"x-reef-scenario": "a" * 200}).status_code == 200
