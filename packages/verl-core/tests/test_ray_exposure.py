"""The Ray that verl starts listens on 127.0.0.1 only, and refuses a client without its token.

Ray is started exactly as the trainer starts it (``init_ray``), a worker group runs a collective (so the
rendezvous store and gloo are listening too), and then every listening TCP socket and bound UDP socket of
this process and all its descendants (the GCS, the raylet with its object manager, the runtime-env agent,
each worker's gRPC server, torch.distributed) is read from the kernel.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import socket
import stat
import sys
import tempfile
from pathlib import Path

import psutil
import pytest
import ray
import torch
import torch.distributed as dist

from verl.core.controller import Dispatch, ResourcePool, Worker, WorkerGroup, init_ray, register
from verl.core.controller.ray_init import warn_if_token_readable_by_others


class Summer(Worker):
    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def all_reduce(self) -> float:
        total = torch.ones(1)
        dist.all_reduce(total)
        return float(total)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def environment(self, names: list[str]) -> dict[str, str | None]:
        return {name: os.environ.get(name) for name in names}


@pytest.fixture(scope="module")
def verl_ray():
    if ray.is_initialized():  # a session left by an earlier module: this test needs a Ray that verl started
        ray.shutdown()
    this_module = sys.modules[Summer.__module__]  # imported from a path: the workers get it by value
    ray.cloudpickle.register_pickle_by_value(this_module)
    init_ray(num_cpus=2)
    pool = ResourcePool(process_on_nodes=[2])
    group = WorkerGroup(pool, Summer)
    try:
        assert group.all_reduce() == [2.0, 2.0]
        yield group
    finally:
        group.shutdown()
        pool.shutdown()
        ray.shutdown()
        ray.cloudpickle.unregister_pickle_by_value(this_module)


def _is_loopback(ip: str) -> bool:
    address = ipaddress.ip_address(ip.split("%")[0])
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return address.is_loopback


def _sockets_of_this_process_tree() -> list[tuple[str, int, str, int, str]]:
    """(process name, pid, protocol, port, address) of every listening TCP and bound UDP socket."""
    found = []
    for process in [psutil.Process(), *psutil.Process().children(recursive=True)]:
        try:
            name = process.name()
            for conn in process.net_connections(kind="inet"):
                if conn.type == socket.SOCK_STREAM and conn.status == psutil.CONN_LISTEN:
                    found.append((name, process.pid, "tcp", conn.laddr.port, conn.laddr.ip))
                elif conn.type == socket.SOCK_DGRAM and conn.laddr:
                    found.append((name, process.pid, "udp", conn.laddr.port, conn.laddr.ip))
        except psutil.NoSuchProcess:
            continue
    return found


def test_every_socket_of_the_local_ray_and_its_workers_listens_on_loopback(verl_ray):
    sockets = _sockets_of_this_process_tree()
    listeners = {name for name, *_ in sockets}
    assert {"gcs_server", "raylet"} <= listeners, f"Ray's own servers were not found among {sorted(listeners)}"
    worker_pids = {site.pid for site in verl_ray.sites}
    assert worker_pids <= {pid for _, pid, *_ in sockets}, "the worker processes' sockets were not found"
    exposed = [s for s in sockets if not _is_loopback(s[4])]
    assert not exposed, f"sockets reachable from other machines: {exposed}"
    assert ray.util.get_node_ip_address() == "127.0.0.1"
    assert {site.node_ip for site in verl_ray.sites} == {"127.0.0.1"}


def _grpc_status(address: str, service: str, *, token: str | None) -> str:
    """The status of a harmless read-only call (``GetAllNodeInfo`` / ``GetNodeStats``) to a Ray server."""
    import grpc
    from ray.core.generated import gcs_service_pb2, gcs_service_pb2_grpc, node_manager_pb2, node_manager_pb2_grpc

    metadata = () if token is None else (("authorization", f"Bearer {token}"),)
    with grpc.insecure_channel(address) as channel:
        try:
            if service == "gcs":
                stub = gcs_service_pb2_grpc.NodeInfoGcsServiceStub(channel)
                stub.GetAllNodeInfo(gcs_service_pb2.GetAllNodeInfoRequest(), metadata=metadata, timeout=30)
            else:
                stub = node_manager_pb2_grpc.NodeManagerServiceStub(channel)
                stub.GetNodeStats(node_manager_pb2.GetNodeStatsRequest(), metadata=metadata, timeout=30)
        except grpc.RpcError as exc:
            return exc.code().name
    return "OK"


def test_the_local_ray_refuses_a_client_without_its_token(verl_ray):
    if os.environ.get("RAY_AUTH_MODE", "").lower() == "disabled":
        pytest.skip("RAY_AUTH_MODE=disabled turns Ray's token authentication off in this environment")
    from ray._raylet import AuthenticationTokenLoader

    header = AuthenticationTokenLoader.instance().get_token_for_http_header()["authorization"]
    token = header.removeprefix("Bearer ")
    context = ray.get_runtime_context()
    node = next(n for n in ray.nodes() if n["NodeID"] == context.get_node_id())
    servers = {
        "gcs": context.gcs_address,
        "raylet": f"{node['NodeManagerAddress']}:{node['NodeManagerPort']}",
    }
    for service, address in servers.items():
        assert _grpc_status(address, service, token=None) == "UNAUTHENTICATED", service
        assert _grpc_status(address, service, token="not-the-token") == "UNAUTHENTICATED", service
        assert _grpc_status(address, service, token=token) == "OK", service  # the same call, authenticated


def test_a_token_file_that_other_users_can_read_is_reported(monkeypatch, caplog):
    folder = Path(tempfile.mkdtemp(prefix="verl-token-"))
    try:
        folder.chmod(0o755)  # /tmp and this folder let everyone reach the file
        token = folder / "auth_token"
        token.write_text("t" * 32)
        monkeypatch.setenv("RAY_AUTH_TOKEN_PATH", str(token))
        monkeypatch.delenv("RAY_AUTH_MODE", raising=False)
        if not all(p.stat().st_mode & stat.S_IXOTH for p in token.parents):
            pytest.skip(f"a folder above {folder} is closed to other users already")
        token.chmod(0o644)
        with caplog.at_level(logging.WARNING, logger="verl.core.controller.ray_init"):
            warn_if_token_readable_by_others()
        assert "can be read by group and other users" in caplog.text and "chmod 600" in caplog.text
        caplog.clear()
        token.chmod(0o600)
        with caplog.at_level(logging.WARNING, logger="verl.core.controller.ray_init"):
            warn_if_token_readable_by_others()
        assert caplog.text == ""
    finally:
        for path in folder.iterdir():
            path.unlink()
        folder.rmdir()


def test_workers_start_with_the_platforms_process_environment(verl_ray):
    """On the CPU platform the workers' allocator keeps freed memory for reuse (variables glibc reads when a
    process starts, so they must be in the environment Ray starts the worker with)."""
    from verl.core.platform.cpu import MALLOC_REUSE

    if os.environ.get("VERL_CPU_MALLOC_REUSE") == "0" or "GLIBC_TUNABLES" in os.environ:
        pytest.skip("this environment turns the allocator setting off")
    expected = {name: os.environ.get(name, value) for name, value in MALLOC_REUSE.items()}
    assert verl_ray.environment(list(MALLOC_REUSE)) == [expected, expected]
