"""A user's own policy (docs/own-policy.md): the shipped example passes the conformance suite and
runs through the ``priosim`` console script from other folders, by file path and by module path,
without PYTHONPATH; a missing file or module is one line and exit status 2."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from policies import check_policy
from plumbing.registry import load_dotted
from tests.conftest import small_scenario

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "docs" / "examples" / "lifo_policy.py"
PRIOSIM = str(Path(sys.executable).parent / "priosim")
SMALL = ["--set", "horizon_s=10", "--set", "streams.0.arrival.n=50", "--no-plots"]


def _priosim(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return subprocess.run([PRIOSIM, *args], cwd=cwd, env=env, capture_output=True, text=True)


def test_example_passes_the_conformance_suite():
    assert check_policy(str(EXAMPLE) + ":LIFO")["policy"] == "lifo"
    assert check_policy(str(EXAMPLE) + ":LIFO", per_class=False)["requests"] == 300


def test_example_serves_newest_first(run):
    """One slot, one class, ten requests arriving 0.1 s apart while the first runs: after it, the
    newest waiting request goes next, and so on backwards."""
    sc = small_scenario(policy={"name": f"{EXAMPLE}:LIFO"})
    sc["engine"].update(max_num_seqs=1, kv_blocks=4096)
    sc["classes"] = sc["classes"][1:]
    sc["streams"] = [{"tenant": "a", "class": "lo", "arrival": {"process": "batch", "n": 10, "spread_s": 1.0},
                      "prompt_tokens": 20, "output_tokens": 200, "max_tokens": 200}]
    r = run(sc).requests.sort_values("admitted_s")
    assert r["request_id"].tolist() == [0, 9, 8, 7, 6, 5, 4, 3, 2, 1]


def test_file_path_from_another_folder(tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    rel = os.path.relpath(EXAMPLE, elsewhere)
    for i, spec in enumerate((f"{EXAMPLE}:LIFO", f"{rel}:LIFO")):
        done = _priosim(elsewhere, "run", "chat_vs_batch", "--policy", spec, "--out", str(tmp_path / f"r{i}"), *SMALL)
        assert done.returncode == 0, done.stderr
        assert f"policy={spec}" in done.stdout


def test_module_path_from_the_users_folder(tmp_path):
    shutil.copy(EXAMPLE, tmp_path / "mypol.py")
    done = _priosim(tmp_path, "run", "chat_vs_batch", "--policy", "mypol:LIFO", "--out", str(tmp_path / "r"), *SMALL)
    assert done.returncode == 0, done.stderr
    assert "policy=mypol:LIFO" in done.stdout


@pytest.mark.parametrize("spec,fragment", [
    ("./nosuch.py:LIFO", "no such file './nosuch.py'"),
    ("nosuch_module_xyz:LIFO", "cannot import module 'nosuch_module_xyz'"),
    (f"{EXAMPLE}:Nope", "has no attribute 'Nope'"),
])
def test_bad_policy_path_is_one_line_exit_2(tmp_path, spec, fragment):
    done = _priosim(tmp_path, "run", "chat_vs_batch", "--policy", spec)
    assert done.returncode == 2 and fragment in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and "Traceback" not in done.stderr


def test_a_file_is_imported_once():
    assert load_dotted(f"{EXAMPLE}:LIFO") is load_dotted(f"{EXAMPLE}:LIFO")


def _user_policy(tmp_path, body: str) -> str:
    (tmp_path / "up.py").write_text("import json\n\nfrom policies import BasePolicy\n\n\nclass P(BasePolicy):\n" + body)
    return f"{tmp_path / 'up.py'}:P"


def test_an_exception_in_the_users_key_is_one_line_naming_hook_and_line(tmp_path):
    from sim import ScenarioError, scenario_from_dict, simulate
    from sim.policy_code import PolicyCodeError

    name = _user_policy(tmp_path, "    def key(self, req, now):\n        return (self.nope, req.arrival_s, req.request_id)\n")
    with pytest.raises(PolicyCodeError) as err:
        simulate(scenario_from_dict(small_scenario(policy={"name": name}, horizon_s=3.0)))
    msg = str(err.value)
    assert isinstance(err.value, ScenarioError) and "\n" not in msg
    assert msg.startswith(f"policy '{name}': key() raised AttributeError:") and msg.endswith("up.py:8)")


def test_an_exception_raised_below_the_users_code_keeps_its_traceback(tmp_path):
    # (the user's key calls a library that raises: not the user's own line; it is not masked)
    from sim import scenario_from_dict, simulate

    name = _user_policy(tmp_path, "    def key(self, req, now):\n"
                                  "        return (json.loads('not json'), req.arrival_s, req.request_id)\n")
    with pytest.raises(json_error()):
        simulate(scenario_from_dict(small_scenario(policy={"name": name}, horizon_s=3.0)))


def json_error():
    import json
    return json.JSONDecodeError
