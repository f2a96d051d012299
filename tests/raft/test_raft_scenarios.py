"""Data-driven interaction scenarios: tests/data/raft/*.txt.

Each block is a command, a `----` line, then the expected output, ended by
a blank line; `#` lines are comments. Run with RAFT_REWRITE=1 to rewrite the
expected outputs from the actual ones (then review the diff).

Commands: cluster voters=1,2,3 [learners=..] [extra=..] [seed=N] [prevote=off]
[checkquorum=off] | campaign N | propose N DATA | conf N add-voter|add-learner|
remove X | transfer N TO | read N CTX | tick [N] [COUNT] | process N.. |
deliver [N] | drop [N] | stabilize | settle ROUNDS | partition 1 | 2 3 | isolate N | heal |
crash N [keep-tail] | restart N | compact N | status | log N | applied N |
reads N
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from raft.core import decode_conf_change
from raft.types import ConfChange, ConfChangeType, EntryType, Message, MsgType
from tests.raft.network import Network

DATA = Path(__file__).resolve().parent.parent / "data" / "raft"
CC_NAMES = {"add-voter": ConfChangeType.ADD_VOTER, "add-learner": ConfChangeType.ADD_LEARNER,
            "remove": ConfChangeType.REMOVE}


def fmt_entry(e) -> str:  # noqa: ANN001 - Entry
    if e.type is EntryType.CONF_CHANGE:
        cc = decode_conf_change(e.data)
        return f"{e.index}/{e.term} {cc.type.name.lower()}({cc.node_id})"
    return f"{e.index}/{e.term} {e.data.decode() or '-'}"


def fmt_msg(m: Message) -> str:
    s = f"{m.frm}->{m.to} {m.type.name} term={m.term}"
    if m.type in (MsgType.APP, MsgType.VOTE, MsgType.PRE_VOTE):
        s += f" prev={m.index}/{m.log_term}"
    if m.type is MsgType.APP:
        s += f" commit={m.commit}"
        if m.entries:
            s += " [" + ", ".join(fmt_entry(e) for e in m.entries) + "]"
    if m.type is MsgType.HEARTBEAT:
        s += f" commit={m.commit}"
    if m.type in (MsgType.APP_RESP, MsgType.READ_INDEX_RESP):
        s += f" index={m.index}"
    if m.reject:
        s += f" reject hint={m.reject_hint}/{m.log_term}"
    if m.snapshot is not None:
        s += f" snapshot={m.snapshot.meta.index}/{m.snapshot.meta.term}"
    if m.context:
        s += f" ctx={m.context.decode()}"
    return s


def ids(arg: str) -> list[int]:
    return [int(x) for x in arg.split(",") if x]


class Interp:
    def __init__(self) -> None:
        self.net: Network | None = None

    def run(self, line: str) -> list[str]:
        cmd, *args = line.split()
        fn = getattr(self, "c_" + cmd.replace("-", "_"), None)
        if fn is None:
            raise ValueError(f"unknown command {cmd!r}")
        out = fn(*args)
        return out or ["ok"]

    @property
    def n(self) -> Network:
        assert self.net is not None, "run `cluster` first"
        return self.net

    def c_cluster(self, *kv: str) -> None:
        opts = dict(a.split("=", 1) for a in kv)
        self.net = Network(
            ids(opts.get("voters", "1,2,3")), ids(opts.get("learners", "")),
            extra=ids(opts.get("extra", "")), seed=int(opts.get("seed", "0")),
            pre_vote=opts.get("prevote", "on") == "on",
            check_quorum=opts.get("checkquorum", "on") == "on",
            election_tick=int(opts.get("election", "10")),
        )

    def c_campaign(self, nid: str) -> None:
        self.n.raft(int(nid)).campaign()

    def c_propose(self, nid: str, data: str) -> list[str]:
        idx = self.n.raft(int(nid)).propose(data.encode())
        return ["dropped" if idx is None else f"index={idx}"]

    def c_conf(self, nid: str, kind: str, target: str) -> list[str]:
        cc = ConfChange(CC_NAMES[kind], int(target))
        idx = self.n.raft(int(nid)).propose_conf_change(cc)
        return ["dropped" if idx is None else f"index={idx}"]

    def c_transfer(self, nid: str, to: str) -> None:
        self.n.raft(int(nid)).transfer_leader(int(to))

    def c_read(self, nid: str, ctx: str) -> None:
        self.n.raft(int(nid)).read_index(ctx.encode())

    def c_tick(self, *args: str) -> None:
        nid = int(args[0]) if args and args[0] != "all" else None
        self.n.tick(nid, int(args[1]) if len(args) > 1 else 1)

    def c_process(self, *nids: str) -> list[str]:
        out = []
        for nid in [int(x) for x in nids] or list(self.n.nodes):
            before = len(self.n.sent)
            if self.n.process(nid):
                out += [fmt_msg(m) for m in self.n.sent[before:]]
        return out

    def c_deliver(self, *args: str) -> list[str]:
        to = int(args[0]) if args else None
        keep, out = [], []
        batch, self.n.queue = self.n.queue, []
        for m in batch:
            if to is not None and m.to != to:
                keep.append(m)
                continue
            if self.n._step_into(m) is not None:
                out.append(fmt_msg(m))
            else:
                out.append(fmt_msg(m) + " (lost)")
        self.n.queue = keep + self.n.queue
        return out

    def c_drop(self, *args: str) -> list[str]:
        to = int(args[0]) if args else None
        dropped = [m for m in self.n.queue if to is None or m.to == to]
        self.n.queue = [m for m in self.n.queue if not (to is None or m.to == to)]
        return [fmt_msg(m) + " (dropped)" for m in dropped]

    def c_stabilize(self) -> None:
        self.n.stabilize()
        self.n.checker.check(self.n)

    def c_settle(self, rounds: str = "1") -> None:
        """`rounds` times: tick everyone once, then stabilize."""
        for _ in range(int(rounds)):
            self.c_tick()
            self.c_stabilize()

    def c_partition(self, *args: str) -> None:
        groups, cur = [], []
        for a in args:
            if a == "|":
                groups.append(cur)
                cur = []
            else:
                cur.append(int(a))
        self.n.partition(*groups, cur)

    def c_isolate(self, nid: str) -> None:
        self.n.isolate(int(nid))

    def c_heal(self) -> None:
        self.n.heal()

    def c_crash(self, nid: str, *flags: str) -> None:
        self.n.crash(int(nid), lose_tail="keep-tail" not in flags)

    def c_restart(self, nid: str) -> None:
        self.n.restart(int(nid))

    def c_compact(self, nid: str) -> list[str]:
        return ["compacted" if self.n.compact(int(nid)) else "nothing to compact"]

    def c_status(self) -> list[str]:
        out = []
        for nid, node in self.n.nodes.items():
            r = node.raft
            if r is None:
                out.append(f"{nid}: down")
                continue
            cs = r.conf_state
            line = (f"{nid}: {r.state.name} term={r.term} lead={r.lead} commit={r.commit} "
                    f"applied={r.applied} last={r.log.last_index()} "
                    f"voters={','.join(map(str, cs.voters))}")
            if cs.learners:
                line += f" learners={','.join(map(str, cs.learners))}"
            out.append(line)
        return out

    def c_log(self, nid: str) -> list[str]:
        log = self.n.raft(int(nid)).log
        lo, hi = log.first_index(), log.last_index()
        return [fmt_entry(e) for e in log.slice(lo, hi + 1)] or ["empty"]

    def c_applied(self, nid: str) -> list[str]:
        sm = self.n.nodes[int(nid)].sm
        return [" ".join(d.decode() for _, (_, ty, d) in sorted(sm.items())
                         if ty == EntryType.NORMAL and d)] if sm else ["nothing"]

    def c_reads(self, nid: str) -> list[str]:
        rs = self.n.nodes[int(nid)].read_states
        return [f"{r.context.decode()}@{r.index}" for r in rs] or ["none"]


def parse(text: str) -> list[tuple[list[str], str, list[str]]]:
    """-> [(comment lines, command, expected lines)]."""
    blocks, comments = [], []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        i += 1
        if not line.strip() or line.startswith("#"):
            if line.startswith("#"):
                comments.append(line)
            continue
        assert i < len(lines) and lines[i] == "----", f"line {i}: expected ---- after {line!r}"
        i += 1
        expected = []
        while i < len(lines) and lines[i].strip():
            expected.append(lines[i])
            i += 1
        blocks.append((comments, line, expected))
        comments = []
    return blocks


def render(blocks: list[tuple[list[str], str, list[str]]]) -> str:
    out = []
    for comments, cmd, lines in blocks:
        out += [*comments, cmd, "----", *lines, ""]
    return "\n".join(out)


@pytest.mark.parametrize("path", sorted(DATA.glob("*.txt")), ids=lambda p: p.stem)
def test_scenario(path: Path) -> None:
    blocks = parse(path.read_text())
    interp = Interp()
    actual = [(c, cmd, interp.run(cmd)) for c, cmd, _ in blocks]
    if os.environ.get("RAFT_REWRITE"):
        path.write_text(render(actual))
        return
    for (_, cmd, want), (_, _, got) in zip(blocks, actual, strict=True):
        assert got == want, f"{path.name}: {cmd}\nwant:\n" + "\n".join(want) + \
            "\ngot:\n" + "\n".join(got)


def test_scenario_files_exist() -> None:
    assert len(list(DATA.glob("*.txt"))) >= 3
