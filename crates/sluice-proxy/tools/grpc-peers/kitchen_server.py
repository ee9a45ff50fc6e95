"""Sluice's Python gRPC test peer: sluice.test.Kitchen (kitchen.proto) and helloworld.Greeter, with reflection.

Usage: kitchen_server.py HOST:PORT   (PORT 0 picks a free port). Prints `listening HOST:PORT` once serving, then
serves until its stdin reaches end of file: the test harness keeps the write end open, so the server cannot
outlive the test process, however that process ends. Stubs come from grpc_tools.protoc, on PYTHONPATH.
"""

import collections
import os
import sys
import threading
import time
from concurrent import futures

import grpc
from google.protobuf import any_pb2, empty_pb2
from google.rpc import error_details_pb2, status_pb2
from grpc_reflection.v1alpha import reflection
from grpc_status import rpc_status

import helloworld_pb2
import helloworld_pb2_grpc
import kitchen_pb2
import kitchen_pb2_grpc

# Slow's watch interval: how soon a deadline or a cancellation is noticed.
POLL_S = 0.005


class Counters:
    def __init__(self):
        self.lock = threading.Lock()
        self.by_key = collections.defaultdict(lambda: [0, 0, 0])  # completed, cancelled, calls

    def add(self, key, index):
        with self.lock:
            for k in {key, None}:
                self.by_key[k][index] += 1

    def get(self, key):
        with self.lock:
            return list(self.by_key[key])


def metadata(context):
    out = {}
    for k, v in context.invocation_metadata():
        if isinstance(v, bytes):
            v = v.hex()
        out[k] = f"{out[k]}, {v}" if k in out else v
    return out


class Kitchen(kitchen_pb2_grpc.KitchenServicer):
    def __init__(self):
        self.counters = Counters()

    def Echo(self, request, context):
        return request

    def Fail(self, request, context):
        try:
            code = next(c for c in grpc.StatusCode if c.value[0] == request.code)
        except StopIteration:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"no gRPC status code {request.code}")
        if code == grpc.StatusCode.OK:
            return empty_pb2.Empty()
        if not request.with_details:
            context.abort(code, request.message)
        info = any_pb2.Any()
        info.Pack(error_details_pb2.ErrorInfo(reason="KITCHEN_FAIL", domain="sluice.test",
                                              metadata={"code": str(request.code)}))
        bad = any_pb2.Any()
        bad.Pack(error_details_pb2.BadRequest(field_violations=[
            error_details_pb2.BadRequest.FieldViolation(field="code", description="asked to fail")]))
        context.abort_with_status(rpc_status.to_status(
            status_pb2.Status(code=request.code, message=request.message, details=[info, bad])))

    def Slow(self, request, context):
        key = metadata(context).get("x-stats-key")
        self.counters.add(key, 2)
        end = time.monotonic() + request.millis / 1000
        while True:
            if not context.is_active():
                self.counters.add(key, 1)
                return kitchen_pb2.SlowReply()
            left = end - time.monotonic()
            if left <= 0:
                break
            time.sleep(min(POLL_S, left))
        self.counters.add(key, 0)
        return kitchen_pb2.SlowReply(slept_ms=request.millis)

    def Stats(self, request, context):
        completed, cancelled, calls = self.counters.get(metadata(context).get("x-stats-key"))
        return kitchen_pb2.StatsReply(completed=completed, cancelled=cancelled, calls=calls)

    def Big(self, request, context):
        size = max(request.size, 0)
        pattern = bytes(range(251))
        return kitchen_pb2.BigReply(data=(pattern * (size // len(pattern) + 1))[:size])

    def Count(self, request, context):
        for i in range(request.n):
            if i > 0:
                time.sleep(request.interval_ms / 1000)
            if not context.is_active():
                return
            yield kitchen_pb2.CountReply(i=i)

    def Sum(self, request_iterator, context):
        total = items = 0
        for item in request_iterator:
            total += item.v
            items += 1
        return kitchen_pb2.SumReply(total=total, items=items)

    def Headers(self, request, context):
        md = metadata(context)
        remaining = context.time_remaining()
        if remaining is not None:
            # grpc-timeout itself is consumed by the gRPC core; the deadline it set is what the server sees.
            md["sluice-test-deadline-ms"] = str(int(remaining * 1000))
        return kitchen_pb2.HeadersReply(metadata=md)


class Greeter(helloworld_pb2_grpc.GreeterServicer):
    def SayHello(self, request, context):
        return helloworld_pb2.HelloReply(message=f"Hello {request.name}")

    def SayHelloStreamReply(self, request, context):
        for i in range(3):
            yield helloworld_pb2.HelloReply(message=f"Hello {request.name} #{i}")


def exit_at_stdin_eof():
    try:
        while sys.stdin.buffer.read(4096):
            pass
    finally:
        os._exit(0)


def main():
    addr = sys.argv[1] if len(sys.argv) > 1 else "127.0.0.1:0"
    host = addr.rsplit(":", 1)[0]
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=32),
        options=[("grpc.max_receive_message_length", 64 << 20), ("grpc.max_send_message_length", 64 << 20)],
    )
    kitchen_pb2_grpc.add_KitchenServicer_to_server(Kitchen(), server)
    helloworld_pb2_grpc.add_GreeterServicer_to_server(Greeter(), server)
    reflection.enable_server_reflection((
        kitchen_pb2.DESCRIPTOR.services_by_name["Kitchen"].full_name,
        helloworld_pb2.DESCRIPTOR.services_by_name["Greeter"].full_name,
        reflection.SERVICE_NAME,
    ), server)
    port = server.add_insecure_port(addr)
    server.start()
    threading.Thread(target=exit_at_stdin_eof, daemon=True).start()
    print(f"listening {host}:{port}", flush=True)
    server.wait_for_termination()


if __name__ == "__main__":
    main()
