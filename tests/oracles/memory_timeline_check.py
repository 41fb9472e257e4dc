#!/usr/bin/env python3
"""Checks a memory timeline written by ts::memory::export_timeline (tests/memory/history_test.cpp)
field by field against Chrome's trace-event format and against the events the test expects.

    python3 memory_timeline_check.py trace.json expected.txt

expected.txt: a first line `device <name> start <allocated> <reserved>`, then one line per
expected instant event, `<name> <size> <address hex or -> <allocated> <reserved or ->`, in order
("-": not checked). Exit 0 when everything matches; otherwise the first mismatch is printed and
the exit status is 1."""
import json
import re
import sys


def fail(message):
    print("memory_timeline_check: " + message)
    sys.exit(1)


def expect(condition, message):
    if not condition:
        fail(message)


def is_int(value):
    return isinstance(value, int) and not isinstance(value, bool)


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    with open(sys.argv[1]) as f:
        trace = json.load(f)  # also checks that the file is JSON
    with open(sys.argv[2]) as f:
        lines = [line.split() for line in f if line.strip()]
    header, expected = lines[0], lines[1:]
    expect(header[0] == "device" and header[2] == "start", f"bad expectation header {header}")
    device = header[1]

    expect(isinstance(trace, dict), "the top level is not an object")
    events = trace.get("traceEvents")
    expect(isinstance(events, list), "traceEvents is not an array")
    expect(trace.get("otherData", {}).get("device") == device, "otherData.device")

    pid = None
    last_ts = None
    pending = {}  # the counter values after the last instant event
    instants = []  # (event, counters at the same time stamp, filled below)
    for i, e in enumerate(events):
        where = f"traceEvents[{i}] = {e}"
        expect(isinstance(e, dict), where + ": not an object")
        for key in ("name", "ph", "pid", "tid"):
            expect(key in e, where + f": no {key!r}")
        expect(isinstance(e["name"], str), where + ": name is not a string")
        expect(is_int(e["pid"]) and is_int(e["tid"]), where + ": pid/tid are not integers")
        pid = e["pid"] if pid is None else pid
        expect(e["pid"] == pid, where + ": another pid")
        ph = e["ph"]
        expect(ph in ("M", "C", "i"), where + f": unexpected phase {ph!r}")
        if ph == "M":
            expect(e["name"] in ("process_name", "thread_name"), where + ": metadata name")
            expect(isinstance(e.get("args", {}).get("name"), str), where + ": metadata args.name")
            continue
        ts = e.get("ts")
        expect(isinstance(ts, (int, float)) and not isinstance(ts, bool), where + ": ts")
        expect(last_ts is None or ts >= last_ts, where + f": ts goes back ({last_ts} -> {ts})")
        last_ts = ts
        args = e.get("args")
        expect(isinstance(args, dict), where + ": no args object")
        if ph == "C":
            expect(e["name"] in (device + " allocated", device + " reserved"),
                   where + ": counter name")
            expect(list(args) == ["bytes"] and is_int(args["bytes"]) and args["bytes"] >= 0,
                   where + ": counter args")
            if instants and instants[-1][1] is None:
                # The two counters written right after an instant event carry its values.
                expect(ts == instants[-1][0]["ts"], where + ": counter after an instant event")
                pending[e["name"]] = args["bytes"]
                if len(pending) == 2:
                    instants[-1][1] = (pending[device + " allocated"],
                                       pending[device + " reserved"])
        else:
            expect(e.get("s") == "t" and e.get("cat") == "memory", where + ": instant scope/cat")
            expect(sorted(args) == ["address", "allocated", "device", "reserved", "size"],
                   where + ": instant args")
            expect(args["device"] == device, where + ": args.device")
            expect(re.fullmatch(r"0x[0-9a-f]+", args["address"]) is not None,
                   where + ": address is not hexadecimal")
            for key in ("size", "allocated", "reserved"):
                expect(is_int(args[key]) and args[key] >= 0, where + f": args.{key}")
            expect(instants == [] or instants[-1][1] is not None,
                   where + ": the previous instant event has no counter values")
            instants.append([e, None])
            pending = {}

    # The counters start at the memory as it was when recording started.
    first = [e for e in events if e["ph"] == "C"][:2]
    expect(len(first) == 2, "no initial counter values")
    start = {e["name"]: e["args"]["bytes"] for e in first}
    expect(start.get(device + " allocated") == int(header[3]),
           f"initial allocated {start} != {header[3]}")
    expect(start.get(device + " reserved") == int(header[4]),
           f"initial reserved {start} != {header[4]}")

    expect(len(instants) == len(expected),
           f"{len(instants)} instant events, expected {len(expected)}")
    expect(instants == [] or instants[-1][1] is not None,
           "the last instant event has no counter values")
    for n, ((e, counter), want) in enumerate(zip(instants, expected)):
        name, size, address, allocated, reserved = want
        args = e["args"]
        where = f"instant event {n} ({e})"
        expect(e["name"] == name, where + f": name, expected {name}")
        expect(args["size"] == int(size), where + f": size, expected {size}")
        if address != "-":
            expect(int(args["address"], 16) == int(address, 16),
                   where + f": address, expected {address}")
        expect(args["allocated"] == int(allocated), where + f": allocated, expected {allocated}")
        expect(counter is not None and counter[0] == int(allocated),
               where + f": allocated counter {counter}, expected {allocated}")
        if reserved != "-":
            expect(args["reserved"] == int(reserved), where + f": reserved, expected {reserved}")
            expect(counter[1] == int(reserved),
                   where + f": reserved counter {counter}, expected {reserved}")
    print(f"memory_timeline_check: {sys.argv[1]}: {len(events)} events match")


if __name__ == "__main__":
    main()
