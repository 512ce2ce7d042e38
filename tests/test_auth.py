"""Authentication and authorisation: CURVE keys, storm-mm's ZAP handler, who may do what, and what a job sees.

Unit tests use real key files and real ZeroMQ sockets (the ZAP handler with CURVE clients on loopback); the
end-to-end tests (slow) start local clusters, which use CURVE by default: a node manager and a remote
client with unknown keys are refused with clear errors, and a rank's environment is its submitter's.
Cancelling someone else's job and submitting as another user are in tests/test_cluster_users.py (they act
as other users).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import pwd
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import zmq
import zmq.asyncio
import zmq.auth
from zmq.utils import z85
from zmq.utils.monitor import parse_monitor_message

from storm.mm.auth import CLIENTS, NODES, AllowedKeys, Gatekeeper, judge
from storm.mm.config import ConfigError, MMConfig, load
from storm.mm.keys import (
    KeyFileError,
    curve_client,
    curve_server,
    handshake_problem,
    read_keypair,
    read_public_key,
    write_keypair,
)
from storm.mm.protocol import KillJob, SubmitJob
from storm.mm.rights import is_operator, key_user, may_manage, run_as_problem
from storm.mm.states import JobState
from storm.mm.store import Store
from storm.tools import cli
from storm.tools.client import Client, ClientError
from storm.tools.local_cluster import LocalCluster
from tests.helpers import JOB_TIMEOUT, poll
from tests.test_cluster_input import standalone_nm
from tests.test_core import T0, Core, reg, state, submit

# ---------------------------------------------------------------------------------------------- key files


def test_keygen_writes_a_zeromq_key_pair_whose_secret_only_its_owner_reads(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["keygen", "node7", "--dir", str(tmp_path)]) == 0
    public, secret = tmp_path / "node7.key", tmp_path / "node7.key_secret"
    assert (public.stat().st_mode & 0o777, secret.stat().st_mode & 0o777) == (0o644, 0o600)
    assert f"public key {public}\nsecret key {secret}" in capsys.readouterr().out
    # ZeroMQ's own reader (zmq.auth, czmq's format) agrees with ours.
    pair = read_keypair(secret)
    assert zmq.auth.load_certificate(secret) == (pair.public, pair.secret)
    assert zmq.auth.load_certificate(public) == (pair.public, None) and read_public_key(public) == pair.public
    assert zmq.curve_public(pair.secret) == pair.public
    # An existing key is kept unless --force: replacing it would lock out whoever uses it.
    assert cli.main(["keygen", "node7", "--dir", str(tmp_path)]) == 1
    assert f"{public} exists: keep it, or replace it with --force" in capsys.readouterr().err
    assert read_keypair(secret) == pair
    assert cli.main(["keygen", "node7", "--dir", str(tmp_path), "--force"]) == 0
    assert read_keypair(secret) != pair
    assert cli.main(["keygen", "../etc/x", "--dir", str(tmp_path)]) == 1
    assert "invalid key name '../etc/x'" in capsys.readouterr().err


def test_key_files_that_cannot_be_used_are_refused_with_what_to_do(tmp_path: Path) -> None:
    public, secret = write_keypair(tmp_path, "a")
    with pytest.raises(
        KeyFileError, match=r"no key file .*/missing.key_secret \(create one with `storm keygen`\)"
    ):
        read_keypair(tmp_path / "missing.key_secret")
    with pytest.raises(
        KeyFileError, match=r"holds no secret key: give the NAME.key_secret file, not NAME.key"
    ):
        read_keypair(public)
    secret.chmod(0o640)
    with pytest.raises(
        KeyFileError, match=rf"{secret} is readable by others \(mode 0640\): chmod 600 {secret}"
    ):
        read_keypair(secret)
    (tmp_path / "junk.key").write_text("hello\n")
    with pytest.raises(KeyFileError, match="holds no public-key line: not a ZeroMQ certificate"):
        read_public_key(tmp_path / "junk.key")
    (tmp_path / "short.key").write_text('curve\n    public-key = "abc"\n')
    with pytest.raises(KeyFileError, match="the public key is not a 40-character Z85 CURVE key"):
        read_public_key(tmp_path / "short.key")


def test_allowed_keys_follow_their_directory(tmp_path: Path) -> None:
    allowed = tmp_path / "nodes"
    allowed.mkdir()
    keys = AllowedKeys(allowed)
    a = read_public_key(write_keypair(tmp_path, "a")[0])
    b = read_public_key(write_keypair(tmp_path, "b@host")[0])
    assert keys.name(a) is None
    shutil.copy(tmp_path / "a.key", allowed / "node0.key")  # the file's name is the peer's name
    (allowed / "junk.key").write_text("not a key\n")
    assert keys.name(a) == "node0" and keys.name(b) is None
    assert keys.problems == [f"{allowed / 'junk.key'} holds no public-key line: not a ZeroMQ certificate"]
    shutil.copy(tmp_path / "b@host.key", allowed / "b@host.key")
    (allowed / "node0.key").unlink()  # revoked
    assert (keys.name(a), keys.name(b)) == (None, "b@host")


def test_the_zap_judgement_takes_only_allowed_curve_keys_of_the_right_domain(tmp_path: Path) -> None:
    for name in ("nodes", "clients"):
        (tmp_path / name).mkdir()
    node = write_keypair(tmp_path / "nodes", "node0")[0]
    user = write_keypair(tmp_path / "clients", "alice")[0]
    domains = {NODES: AllowedKeys(tmp_path / "nodes"), CLIENTS: AllowedKeys(tmp_path / "clients")}
    raw = {name: z85.decode(read_public_key(path)) for name, path in (("node", node), ("user", user))}
    assert judge(domains, NODES, b"CURVE", [raw["node"]]).user_id == "node0"
    assert judge(domains, CLIENTS, b"CURVE", [raw["user"]]).user_id == "alice"
    # A user's key is no node key and the other way round: the domains are separate directories.
    refused = judge(domains, NODES, b"CURVE", [raw["user"]])
    assert not refused.allowed and refused.reason == (
        f"public key {read_public_key(user).decode()} is not in {tmp_path / 'nodes'}"
    )
    assert not judge(domains, CLIENTS, b"CURVE", [raw["node"]]).allowed
    for mechanism, credentials in ((b"NULL", []), (b"PLAIN", [b"u", b"p"]), (b"CURVE", [b"short"])):
        verdict = judge(domains, NODES, mechanism, credentials)
        assert not verdict.allowed and "CURVE keys only" in verdict.reason
    assert judge(domains, "", b"CURVE", [raw["node"]]).reason == "unknown ZAP domain ''"


def test_the_gatekeeper_lets_allowed_keys_in_and_logs_each_refused_peer_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Real CURVE handshakes on loopback: the allowed client's messages carry its key's name as User-Id;
    the refused one is told so (AUTH, status 400) every time it tries, and the MM logs it once."""
    (tmp_path / "nodes").mkdir()
    server = read_keypair(write_keypair(tmp_path, "mm")[1])
    good = read_keypair(write_keypair(tmp_path, "good")[1])
    bad = read_keypair(write_keypair(tmp_path, "bad")[1])
    shutil.copy(tmp_path / "good.key", tmp_path / "nodes" / "node3.key")

    async def scenario() -> tuple[bytes, str, list[int]]:
        ctx, peers = zmq.asyncio.Context(), zmq.asyncio.Context()
        gate = Gatekeeper(ctx, {NODES: AllowedKeys(tmp_path / "nodes")})
        task = asyncio.create_task(gate.serve())
        router = ctx.socket(zmq.ROUTER)
        curve_server(router, server, NODES)
        port = router.bind_to_random_port("tcp://127.0.0.1")
        sockets = [router]
        try:
            refusals = []
            for _ in range(3):  # a refused peer that tries again (a new connection each time)
                intruder = peers.socket(zmq.DEALER)
                sockets.append(intruder)
                curve_client(intruder, bad, server.public)
                monitor = intruder.get_monitor_socket(zmq.EVENT_HANDSHAKE_FAILED_AUTH)
                sockets.append(monitor)
                intruder.connect(f"tcp://127.0.0.1:{port}")
                event = parse_monitor_message(await asyncio.wait_for(monitor.recv_multipart(), 10))
                refusals.append(event["value"])
                intruder.disable_monitor()
            friend = peers.socket(zmq.DEALER)
            sockets.append(friend)
            curve_client(friend, good, server.public)
            friend.connect(f"tcp://127.0.0.1:{port}")
            await friend.send(b"hello")
            frames = await asyncio.wait_for(router.recv_multipart(copy=False), 10)
            return frames[1].bytes, str(frames[1].get("User-Id")), refusals
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            for s in sockets:
                s.close(linger=0)
            gate.close()
            ctx.term()
            peers.term()

    with caplog.at_level(logging.WARNING, logger="storm.mm"):
        body, user_id, refusals = asyncio.run(scenario())
    assert (body, user_id, refusals) == (b"hello", "node3", [400, 400, 400])
    logged = [r.getMessage() for r in caplog.records if "refused" in r.getMessage()]
    key, where = bad.public.decode(), tmp_path / "nodes"
    assert logged == [f"refused a node connection from 127.0.0.1: public key {key} is not in {where}"]


def test_handshake_failures_are_told_in_words_an_operator_can_act_on() -> None:
    auth, protocol = zmq.EVENT_HANDSHAKE_FAILED_AUTH, zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
    peer = "storm-mm at tcp://mm:6817"
    assert handshake_problem(auth, 400, server=False, peer=peer) == (
        "storm-mm at tcp://mm:6817 refused this key (status 400): the server does not allow it"
    )
    assert "disagree on CURVE: one of them has no keys configured" in handshake_problem(
        protocol, zmq.PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH, server=False, peer=peer
    )
    assert "it does not hold this side's public key" in handshake_problem(
        protocol, zmq.PROTOCOL_ERROR_ZMTP_CRYPTOGRAPHIC, server=True, peer="tcp://*:6817"
    )
    assert "wrong server public key, or the server uses no keys" in handshake_problem(
        zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL, 0, server=False, peer=peer
    )


def test_key_settings_that_cannot_work_are_configuration_errors() -> None:
    with pytest.raises(ConfigError, match=r"remote clients are served only with CURVE: set mm\.key and"):
        load(None, {"mm": {"client_tcp_endpoint": "tcp://*:6819"}})
    with pytest.raises(ConfigError, match=r"mm\.node_keys: with mm\.key, name the directory"):
        load(None, {"mm": {"key": "/etc/storm/keys/mm.key_secret"}})
    with pytest.raises(ConfigError, match="need the MM's own key pair"):
        load(None, {"mm": {"node_keys": "/etc/storm/keys/nodes"}})
    keys = {"key": "/k/mm.key_secret", "node_keys": "/k/nodes", "client_keys": "/k/clients"}
    with pytest.raises(ConfigError, match="must be tcp://"):
        load(None, {"mm": {**keys, "client_tcp_endpoint": "ipc:///tmp/x"}})
    config = load(None, {"mm": {**keys, "client_tcp_endpoint": "tcp://*:6819", "operators": "alice, 1001"}})
    assert config.mm.operators == ["alice", "1001"] and config.nm.key == config.nm.mm_key == ""


def test_storm_mm_will_not_start_with_keys_it_cannot_use(tmp_path: Path) -> None:
    secret = write_keypair(tmp_path, "mm")[1]
    secret.chmod(0o644)

    def start(node_keys: Path) -> str:
        argv = [
            sys.executable, "-m", "storm.mm.main", "--state-dir", str(tmp_path / "state"),
            "--client-endpoint", f"ipc://{tmp_path / 'mm.sock'}", "--node-endpoint", "tcp://127.0.0.1:0",
            "--key", str(secret), "--node-keys", str(node_keys), "--realtime", "false",
        ]  # fmt: skip
        result = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)
        assert result.returncode == 1, result.stderr
        return result.stderr.strip().splitlines()[-1]

    readable = f"{secret} is readable by others (mode 0644): chmod 600 {secret}"
    assert start(tmp_path) == f"storm-mm: [mm] key: {readable}"
    secret.chmod(0o600)
    nodes = tmp_path / "nodes"
    assert start(nodes) == f"storm-mm: [mm] node_keys: no directory {nodes} (mkdir it)"


def test_a_remote_client_without_keys_is_told_what_it_needs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("STORM_KEY", str(tmp_path / "me.key_secret"))
    with pytest.raises(ClientError) as missing:
        Client("tcp://127.0.0.1:9")
    assert missing.value.code == "no_key"
    assert str(missing.value).startswith(
        f"no key file {tmp_path / 'me.key_secret'} (create one with `storm keygen`)"
    )
    assert "takes remote clients with CURVE keys only" in str(missing.value)


# ---------------------------------------------------------------------------------------------- rights


def test_owners_root_and_operators_may_manage_a_job() -> None:
    operators = ["alice", "1002"]
    assert may_manage(1000, "bob", 1000, []) and may_manage(0, "root", 1000, [])
    assert not may_manage(1001, "carol", 1000, operators)
    assert may_manage(1001, "alice", 1000, operators)  # by name
    assert may_manage(1002, "dave", 1000, operators)  # by uid
    assert is_operator(0, "root", []) and not is_operator(1003, "1002", ["1002x"])


def test_the_mm_lets_operators_cancel_any_job_and_users_only_theirs(store: Store) -> None:
    ctl = Core(store, MMConfig(operators=["carol", "1003"]), T0, "mm-1")
    reg(ctl, "n1", pes=4)
    jobs = [submit(ctl, 1) for _ in range(3)]  # alice's (uid 1000)
    assert ctl.cancel((jobs[0],), 1001, "bob", T0 + 1) == {
        str(jobs[0]): f"permission denied: job {jobs[0]} belongs to alice"
    }
    assert state(ctl, jobs[0]) is JobState.STARTING
    assert ctl.cancel((jobs[0],), 1002, "carol", T0 + 1) == {str(jobs[0]): "cancelling"}  # by name
    assert ctl.cancel((jobs[1],), 1003, "dave", T0 + 1) == {str(jobs[1]): "cancelling"}  # by uid
    assert ctl.cancel((jobs[2],), 1000, "alice", T0 + 1) == {str(jobs[2]): "cancelling"}  # the owner
    kills = [m for _, m in ctl.outbox if isinstance(m, KillJob)]
    assert [m.reason for m in kills] == ["cancelled by carol", "cancelled by dave", "cancelled by alice"]


def test_a_submission_may_ask_only_for_its_callers_own_identity() -> None:
    def problem(uid: int | None = None, gid: int | None = None, user: str = "") -> str | None:
        asked = SubmitJob(ranks=1, argv=("true",), cwd="/", env={}, uid=uid, gid=gid, user=user)
        return run_as_problem(asked, uid=1000, gid=100, user="bob")  # bob is calling

    assert problem() is None and problem(1000, 100, "bob") is None and problem(user="bob") is None
    why = "storm runs a job only as the user who submits it"
    assert problem(uid=0) == f"the job asks to run as uid 0, but you are bob (uid 1000): {why}"
    assert problem(user="alice") == f"the job asks to run as user alice, but you are bob (uid 1000): {why}"
    assert problem(gid=0) == f"the job asks to run with gid 0, but yours is 100: {why}, with their group"
    assert (key_user("alice@laptop"), key_user("alice")) == ("alice", "alice")


# ---------------------------------------------------------------------------------------------- end to end


def log_has(path: Path, pattern: str) -> Callable[[], bool]:
    return lambda: path.exists() and re.search(pattern, path.read_text(errors="replace")) is not None


def node_states(cluster: LocalCluster) -> dict[str, str]:
    with cluster.client() as client:
        return {n.name: n.state for n in client.nodes()}


@pytest.mark.slow
def test_a_node_manager_with_an_unknown_key_is_refused_and_never_up(
    make_cluster: Callable[..., LocalCluster], tmp_path: Path
) -> None:
    cluster = make_cluster(nodes=1)
    mm_log = cluster.dir / "mm" / "mm.log"
    intruder = read_keypair(write_keypair(tmp_path, "intruder")[1])
    mm_key = str(cluster.key_dir / "mm.key")
    keyed = ("--key", str(tmp_path / "intruder.key_secret"), "--mm-key", mm_key)
    intruder_log, plain_log = tmp_path / "intruder.log", tmp_path / "plain.log"
    with (
        standalone_nm(cluster.node_endpoint, tmp_path / "intruder", *keyed, name="intruder"),
        standalone_nm(cluster.node_endpoint, tmp_path / "plain", name="plain"),  # no keys at all
    ):
        key, where = re.escape(intruder.public.decode()), re.escape(str(cluster.key_dir / "nodes"))
        refused = rf"WARNING refused a node connection from 127\.0\.0\.1: public key {key} is not in {where}"
        poll(log_has(mm_log, refused), 15, "storm-mm to log the refused key")
        poll(log_has(mm_log, "failed the handshake: it has no keys"), 15, "storm-mm to log the keyless NM")
        poll(
            log_has(intruder_log, r"storm-mm at tcp://\S+ refused this key \(status 400\)"),
            15,
            "the intruder to log that its key was refused",
        )
        poll(
            log_has(plain_log, "disagree on CURVE: one of them has no keys"), 15, "the keyless NM to log why"
        )
        assert node_states(cluster) == {"node0": "UP"}
        # The same node manager joins once the operator allows its key (no restart of either daemon).
        shutil.copy(tmp_path / "intruder.key", cluster.key_dir / "nodes" / "intruder.key")
        poll(lambda: node_states(cluster).get("intruder") == "UP", 15, "the allowed node to register")
        assert "plain" not in node_states(cluster)


def remote_cli(
    cluster: LocalCluster, key: Path, *args: str, cwd: Path = Path("/")
) -> subprocess.CompletedProcess[str]:
    """The `storm` command on a "remote" host: the MM's TCP client endpoint, a key pair, the MM's key."""
    env = {
        **os.environ, "STORM_MM": cluster.remote_endpoint, "STORM_KEY": str(key),
        "STORM_MM_KEY": str(cluster.key_dir / "mm.key"),
    }  # fmt: skip
    return subprocess.run(
        [sys.executable, "-m", "storm.tools.cli", *args],
        env=env, cwd=cwd, capture_output=True, text=True, timeout=JOB_TIMEOUT, check=False,
    )  # fmt: skip


@pytest.mark.slow
def test_remote_clients_need_an_allowed_key_and_act_as_the_user_it_names(
    make_cluster: Callable[..., LocalCluster], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cluster = make_cluster(nodes=1, mm_client_tcp_endpoint="tcp://127.0.0.1:0")
    assert cluster.remote_endpoint.startswith("tcp://127.0.0.1:")
    stranger = write_keypair(tmp_path, "stranger")[1]
    started = time.monotonic()
    refused = remote_cli(cluster, stranger, "queue")
    assert time.monotonic() - started < 10  # told at once, not after the 30 s time-out
    assert (refused.returncode, refused.stdout) == (1, "")
    assert refused.stderr == (
        f"storm queue: storm-mm at {cluster.remote_endpoint} refused this key (status 400): the server does"
        f" not allow it; ask its operator to allow {tmp_path / 'stranger.key'} (copy it into the MM's [mm]"
        " client_keys directory)\n"
    )
    mm_log = cluster.dir / "mm" / "mm.log"
    assert log_has(mm_log, r"refused a client connection from 127\.0\.0\.1: public key \S+ is not in")()
    # A node's key is no client key: the two are separate directories.
    as_node = remote_cli(cluster, cluster.key_dir / "node0.key_secret", "nodes")
    assert as_node.returncode == 1 and "refused this key" in as_node.stderr
    # The whole round trip over the remote socket, --wait included (as the admin's key: root).
    admin_key = cluster.client_key("root@admin")
    admin = remote_cli(cluster, admin_key, "submit", "-n", "1", "--wait", "--", "true", cwd=tmp_path)
    assert admin.returncode == 0, admin.stderr
    with cluster.client() as local:
        assert local.job(int(admin.stdout)).user == "root"
    # An allowed key acts as the user it names (before any '@'), as a local client of that uid would. (Its
    # job waits behind root's: nobody could not reach the job shells' socket in pytest's private tmp.)
    nobody = pwd.getpwnam("nobody")
    with cluster.client() as local:
        roots = local.submit(["sleep", "60"], 1, cwd=str(tmp_path), output="/dev/null")
        monkeypatch.setenv("STORM_MM_KEY", str(cluster.key_dir / "mm.key"))
        monkeypatch.setenv("STORM_KEY", str(cluster.client_key("nobody@laptop")))
        with Client(cluster.remote_endpoint, timeout=10) as remote:
            theirs = remote.job(remote.submit(["true"], 1, cwd="/", output="/dev/null"))
            assert (theirs.user, theirs.uid, theirs.state) == ("nobody", nobody.pw_uid, "PENDING")
            refused = remote.cancel((roots,))[str(roots)]
            assert refused.startswith(f"permission denied: job {roots} belongs to root")
            assert remote.cancel((theirs.id,)) == {str(theirs.id): "cancelled"}
        monkeypatch.setenv("STORM_KEY", str(cluster.client_key("no-such-user")))
        with Client(cluster.remote_endpoint, timeout=10) as remote, pytest.raises(ClientError) as nobody_here:
            remote.nodes()
        assert nobody_here.value.code == "unauthenticated"
        assert str(nobody_here.value) == "client key 'no-such-user' names no user on storm-mm's host"
        assert local.cancel((roots,)) == {str(roots): "cancelling"}


@pytest.mark.slow
def test_a_rank_sees_its_submitters_environment_and_nothing_of_the_daemons(
    make_cluster: Callable[..., LocalCluster], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The node manager's environment (here with a secret, a key path and systemd's variables) reaches
    neither the job shell nor the ranks: a rank gets the environment the client sent, plus storm's own."""
    secret = "daemon-secret-4f1c"  # noqa: S105 (a value to look for, not a credential)
    for name, value in (
        ("STORM_TEST_SECRET", secret), ("STORM_KEY", "/etc/storm/keys/node.key_secret"),
        ("NOTIFY_SOCKET", str(tmp_path / "no-such-notify-socket")), ("INVOCATION_ID", secret),
    ):  # fmt: skip
        monkeypatch.setenv(name, value)
    cluster = make_cluster(nodes=1)
    daemon_env = Path(f"/proc/{cluster.nms[0].pid}/environ").read_bytes()
    assert secret.encode() in daemon_env  # what the daemon has, and must keep to itself
    program = (
        "import json, os\n"
        "shell = open(f'/proc/{os.getppid()}/environ', 'rb').read()\n"
        "print(json.dumps({'rank': dict(os.environ), 'shell': shell.decode(errors='replace')}))\n"
    )
    env = {"PATH": os.environ["PATH"], "LANG": "C.UTF-8", "HOME": str(tmp_path), "MY_SETTING": "mine"}
    out = tmp_path / "env.out"
    with cluster.client() as client:
        job_id = client.submit(
            [sys.executable, "-c", program], 1, cwd=str(tmp_path), env=env, output=str(out)
        )
        assert client.wait(job_id, timeout=JOB_TIMEOUT).state == "COMPLETED"
    seen = json.loads(out.read_text())
    storms = {"PMI_FD", "PMI_RANK", "PMI_SIZE", "STORM_JOB_ID", "STORM_RANK", "STORM_SIZE", "STORM_NODE"}
    hook = {"LD_PRELOAD", "STORM_HOOK_SEGMENT", "STORM_HOOK_INDEX"}
    rank = seen["rank"]
    assert set(rank) - storms - hook == set(env) and all(rank[k] == v for k, v in env.items())
    assert secret not in json.dumps(rank)
    shell = dict(item.split("=", 1) for item in seen["shell"].split("\0") if item)
    assert set(shell) <= {"PATH", "LANG"} and secret not in seen["shell"]
