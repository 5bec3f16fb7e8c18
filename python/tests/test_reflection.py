"""gRPC server reflection as the usual tools ask for it: Python's
grpcio-reflection client (like older grpcurl and evans) speaks
``grpc.reflection.v1alpha``; the coordinator and every worker answer it
(as well as ``v1``) with the services they serve."""

from __future__ import annotations

import subprocess

import grpc
import pytest
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from conftest import SERVER, WORKER, needs_binaries, read_line



def services(address: str) -> set[str]:
    """The services `address` lists over v1alpha reflection."""
    with grpc.insecure_channel(address) as channel:
        stub = reflection_pb2_grpc.ServerReflectionStub(channel)
        request = reflection_pb2.ServerReflectionRequest(list_services="")
        replies = stub.ServerReflectionInfo(iter([request]), timeout=10)
        return {s.name for reply in replies for s in reply.list_services_response.service}


@needs_binaries
def test_v1alpha_reflection_lists_the_coordinators_and_a_workers_services():
    procs = []
    try:
        server = subprocess.Popen([str(SERVER), "--listen", "127.0.0.1:0"],
                                  stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        procs.append(server)
        coordinator = read_line(server, "listening ", 30)
        worker = subprocess.Popen([str(WORKER), "--coordinator", "http://" + coordinator, "--listen", "127.0.0.1:0"],
                                  stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        procs.append(worker)
        at = read_line(worker, "listening ", 30)

        listed = services(coordinator)
        for name in ("loader.v1.TrainerService", "loader.v1.WorkerService", "loader.v1.AdminService",
                     "grpc.health.v1.Health", "grpc.reflection.v1alpha.ServerReflection"):
            assert name in listed, (name, sorted(listed))
        listed = services(at)
        assert "loader.v1.BatchService" in listed, sorted(listed)
        assert "grpc.reflection.v1alpha.ServerReflection" in listed, sorted(listed)
    finally:
        for proc in reversed(procs):
            proc.kill()
            proc.wait(10)
