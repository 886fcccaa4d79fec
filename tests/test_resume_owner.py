"""Resume state is matched to its owner: each client's checkpoint file records its client and round
(under the file's content hash), and a resume reads a file only for the slot it was written for. A
file swapped, copied or renamed into another client's slot or round, or one that records no owner,
sets the checkpoint aside like a corrupt one (one log line), and the run starts afresh and ends equal
to an uninterrupted run; it never trains a client on another's state.

Table: :data:`TAMPERINGS`, each applied to a SCAFFOLD checkpoint (its c_i are per-client files) of a
run stopped after round 3 of 4.
"""

from __future__ import annotations

import logging
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
from fakes import assert_identical, digits_clients, tiny_digits_model

from fedpipe.algorithms import ALGORITHMS, algorithm_config
from fedpipe.config.fl import FLConfig, LocalTrainConfig
from fedpipe.data import ClientData
from fedpipe.errors import InputError
from fedpipe.fl import run_federated
from fedpipe.fl.engine import CLIENTS_DIR, read_client_file
from fedpipe.io import load_tensors, save_tensors
from fedpipe.tasks import ClassificationTask

NUM_CLIENTS = 4
ROUNDS, STOP = 4, 3  # with half the clients per round, client 2 trains in rounds 1 and 3


@pytest.fixture(scope="module")
def clients() -> list[ClientData]:
    return digits_clients(NUM_CLIENTS, 60)


def run(clients, participation: float, **kw):
    local = LocalTrainConfig(epochs=1, batch_size=32, lr=0.1)
    fl = FLConfig(rounds=ROUNDS, participation=participation, local=local, checkpoint_every=1)
    strategy = ALGORITHMS["scaffold"](ClassificationTask(), tiny_digits_model, local,
                                      algorithm_config("scaffold", {}), num_clients=NUM_CLIENTS)
    return run_federated(strategy, tiny_digits_model(), clients, fl, 0, progress=False, fingerprint="f",
                         **kw)


def files(ckpt: Path) -> dict[int, Path]:
    """{client: its state file} of the checkpoint (one version per client after a save)."""
    return {int(f.name.split("-")[0]): f for f in sorted((ckpt / CLIENTS_DIR).iterdir())}


# -- tamperings: each returns what the set-aside line says (alternatives split by |; None: the
# checkpoint resumes)
def owner(f: Path) -> str:
    """``client <id> after round <r>``, as its name says."""
    cid, rnd = f.stem.split("-r")
    return f"client {cid} after round {rnd}"


def swap(ckpt: Path, older: Path) -> str | None:
    """Two clients' files trade contents (their names, and the manifest, stay)."""
    a, b = list(files(ckpt).values())[:2]
    da, db = a.read_bytes(), b.read_bytes()
    a.write_bytes(db)
    b.write_bytes(da)
    return (f"holds the state of {owner(b)}, not of {owner(a)}"  # either may be read first
            f"|holds the state of {owner(a)}, not of {owner(b)}")


def copy_over(ckpt: Path, older: Path) -> str | None:
    """One client's file copied over another's."""
    a, b = list(files(ckpt).values())[:2]
    b.write_bytes(a.read_bytes())
    return f"holds the state of {owner(a)}, not of {owner(b)}"


def older_round(ckpt: Path, older: Path) -> str | None:
    """A client's file from round 1's checkpoint put in its slot of round 3's, under the name of a
    later round."""
    now = files(ckpt)
    cid, old = next((c, f) for c, f in files(older).items() if now[c].name != f.name)
    now[cid].write_bytes(old.read_bytes())
    return f"holds the state of {owner(old)}, not of {owner(now[cid])}"


def no_owner(ckpt: Path, older: Path) -> str | None:
    """A client's tensors written again without the record of their owner (a valid file, with a
    content hash, that this pipeline did not write as a client's state)."""
    f = next(iter(files(ckpt).values()))
    save_tensors(f, load_tensors(f))
    return "records no owner"


def untouched(ckpt: Path, older: Path) -> str | None:
    """The control: the checkpoint as written."""
    return None


TAMPERINGS: dict[str, Callable[[Path, Path], str | None]] = {
    "two clients' files swapped": swap,
    "a client's file copied over another's": copy_over,
    "an older round's file in a current slot": older_round,
    "a file without its owner": no_owner,
    "untouched": untouched,
}


@pytest.mark.parametrize("participation", [1.0, 0.5], ids=["every client", "half the clients"])
@pytest.mark.parametrize("name", TAMPERINGS)
def test_a_client_file_not_its_slots_owner_is_set_aside_never_resumed(name, participation, clients,
                                                                      tmp_path, caplog):
    tamper = TAMPERINGS[name]
    full = run(clients, participation)
    ckpt, older = tmp_path / "ckpt", tmp_path / "older"
    run(clients, participation, checkpoint_dir=ckpt, stop_after=1)
    shutil.copytree(ckpt, older)  # round 1's client files, for older_round
    run(clients, participation, checkpoint_dir=ckpt, stop_after=STOP)
    said = tamper(ckpt, older)
    with caplog.at_level(logging.WARNING, logger="fedpipe.io"):
        resumed = run(clients, participation, checkpoint_dir=ckpt)
    aside = sorted(tmp_path.glob("ckpt.corrupt-*"))
    if said is None:
        assert resumed.resumed_from == STOP and not aside and not caplog.records
    else:
        assert resumed.resumed_from == 0 and len(aside) == 1  # afresh, the tampered state kept
        (line,) = [r.getMessage() for r in caplog.records]
        assert any(x in line for x in said.split("|")), line
        assert "checkpoint not resumed" in line and "\n" not in line
    assert resumed.history == full.history
    assert_identical(resumed.state.weights, full.state.weights)
    assert_identical(resumed.state.extra, full.state.extra)
    assert resumed.client_states.keys() == full.client_states.keys()
    for cid in full.client_states:
        assert_identical(resumed.client_states[cid], full.client_states[cid])


OWNERS = {  # (the file's client, the slot read for): what the InputError says, None: read
    (0, 0): None,
    (0, 1): f"holds the state of client 0 after round {STOP}, not of client 1",
    (1, 0): f"holds the state of client 1 after round {STOP}, not of client 0",
}


@pytest.mark.parametrize("owner, slot", list(OWNERS))
def test_a_client_file_is_read_only_for_its_own_slot(owner, slot, clients, tmp_path):
    run(clients, 1.0, checkpoint_dir=tmp_path, stop_after=STOP)
    f = files(tmp_path)[owner]
    target = tmp_path / CLIENTS_DIR / f"{slot}-r{STOP}.safetensors"
    if target != f:
        target.write_bytes(f.read_bytes())
    if OWNERS[owner, slot] is None:
        assert set(read_client_file(target, slot)) == {"c_i"}
        return
    with pytest.raises(InputError, match=OWNERS[owner, slot]):
        read_client_file(target, slot)
    with pytest.raises(InputError, match="is not a state file of client 3"):
        read_client_file(target, 3)  # a name that is not the slot's
