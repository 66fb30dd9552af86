"""Checks a running Shardline daemon as any gRPC tool sees it, with the
reference Python clients (grpcio-reflection, grpcio-health-checking):
server reflection lists the services named in LISTED (and the health
service), every service in LISTED and DESCRIBED resolves to a descriptor
with its methods (DESCRIBED: served through gRPC's generic API, so not
listed, yet described), and the health service says SERVING for the server
and for each of them.

Usage: check_grpc_services.py ADDRESS LISTED[,...] [DESCRIBED[,...]]
Exit status 0 when all holds; else a message saying what did not.
"""
import sys

import grpc
from google.protobuf import descriptor_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc


def reflect(channel, requests):
    stub = reflection_pb2_grpc.ServerReflectionStub(channel)
    return list(stub.ServerReflectionInfo(iter(requests), timeout=10))


def listed_services(channel):
    [response] = reflect(channel, [reflection_pb2.ServerReflectionRequest(list_services="")])
    return {s.name for s in response.list_services_response.service}


def methods_of(channel, service):
    [response] = reflect(channel, [reflection_pb2.ServerReflectionRequest(file_containing_symbol=service)])
    if response.HasField("error_response"):
        raise SystemExit("%s: reflection cannot describe %s: %s"
                         % (channel_address, service, response.error_response.error_message))
    package, _, name = service.rpartition(".")
    for raw in response.file_descriptor_response.file_descriptor_proto:
        file = descriptor_pb2.FileDescriptorProto.FromString(raw)
        if file.package != package:
            continue
        for s in file.service:
            if s.name == name:
                return [m.name for m in s.method]
    raise SystemExit("%s: the descriptor sent for %s does not hold it" % (channel_address, service))


def main():
    global channel_address
    if len(sys.argv) not in (3, 4):
        raise SystemExit(__doc__)
    channel_address = sys.argv[1]
    listed = [s for s in sys.argv[2].split(",") if s]
    described = [s for s in sys.argv[3].split(",") if s] if len(sys.argv) == 4 else []
    with grpc.insecure_channel(channel_address) as channel:
        grpc.channel_ready_future(channel).result(timeout=10)
        names = listed_services(channel)
        for service in listed + ["grpc.health.v1.Health"]:
            if service not in names:
                raise SystemExit("%s: reflection does not list %s (it lists %s)"
                                 % (channel_address, service, sorted(names)))
        health = health_pb2_grpc.HealthStub(channel)
        for service in [""] + listed + described:
            methods = methods_of(channel, service) if service else ["(server)"]
            if not methods:
                raise SystemExit("%s: %s has no methods" % (channel_address, service))
            status = health.Check(health_pb2.HealthCheckRequest(service=service), timeout=10).status
            if status != health_pb2.HealthCheckResponse.SERVING:
                raise SystemExit("%s: health of %r is %s, not SERVING" % (
                    channel_address, service, health_pb2.HealthCheckResponse.ServingStatus.Name(status)))
            print("%s %s: SERVING, methods %s" % (channel_address, service or "(server)", ", ".join(methods)))


channel_address = ""

if __name__ == "__main__":
    main()
