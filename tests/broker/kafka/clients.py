"""Kafka clients against seglog's Kafka listener, run by tests/broker/kafka_clients.rs.

Each mode prints one JSON object on stdout; the Rust test asserts on it. Exit code 3:
a client library is missing (the Rust test decides whether that fails).
"""
import json
import sys
import time

DEADLINE_S = 60


def out(obj):
    print(json.dumps(obj))
    sys.stdout.flush()


def confluent_idempotent(boot, topic, n):
    from confluent_kafka import Producer

    p = Producer({"bootstrap.servers": boot, "enable.idempotence": True, "acks": "all",
                  "linger.ms": 5})
    reports = []

    def cb(err, msg):
        reports.append((None if err is None else str(err), msg.partition(), msg.offset()))

    for i in range(n):
        while True:
            try:
                p.produce(topic, key=b"k%d" % i, value=b"v%d" % i, on_delivery=cb)
                break
            except BufferError:
                p.poll(0.05)
        p.poll(0)
    p.flush(DEADLINE_S)
    errors = [r for r in reports if r[0] is not None]
    offsets = {}
    for _, part, off in reports:
        offsets.setdefault(part, []).append(off)
    contiguous = all(sorted(v) == list(range(min(v), min(v) + len(v))) for v in offsets.values())
    out({"reports": len(reports), "errors": errors[:5], "with_offsets": sum(1 for r in reports if r[2] >= 0),
         "contiguous": contiguous, "partitions": sorted(offsets)})


def confluent_group(boot, topic, group, total):
    from confluent_kafka import Consumer, KafkaException

    def consumer(name):
        return Consumer({"bootstrap.servers": boot, "group.id": group, "client.id": name,
                         "auto.offset.reset": "earliest", "enable.auto.commit": False,
                         "session.timeout.ms": 6000, "heartbeat.interval.ms": 500})

    c1, c2 = consumer("c1"), consumer("c2")
    c1.subscribe([topic])
    c2.subscribe([topic])
    seen = set()
    split = None
    end = time.time() + DEADLINE_S
    while time.time() < end:
        for c in (c1, c2):
            m = c.poll(0.2)
            if m is not None and m.error() is None:
                seen.add((m.partition(), m.offset()))
        a1 = {t.partition for t in c1.assignment()}
        a2 = {t.partition for t in c2.assignment()}
        if a1 and a2 and split is None:
            split = [sorted(a1), sorted(a2)]
        if split is not None and len(seen) >= total // 2:
            break
    c1.commit(asynchronous=False) if seen else None
    c2.commit(asynchronous=False) if seen else None
    c2.close()
    # `seen` can be full while c1, the owner of every partition now, has not read a
    # partition it (or c2) read before the rebalance: wait until its position, or the
    # group's committed offset, is at each partition's end, so the commit covers all.
    def at_end(c):
        parts = c.assignment()
        pos = {tp.partition: tp.offset for tp in c.position(parts)}
        com = {tp.partition: tp.offset for tp in c.committed(parts, timeout=5)}
        for tp in parts:
            _, high = c.get_watermark_offsets(tp, timeout=5, cached=False)
            if max(pos[tp.partition], com[tp.partition]) < high:
                return False
        return True

    after = None
    while time.time() < end:
        batch = c1.consume(500, 0.2)
        for m in batch:
            if m.error() is None:
                seen.add((m.partition(), m.offset()))
        a1 = sorted(t.partition for t in c1.assignment())
        if split is not None and len(a1) == len(split[0]) + len(split[1]):
            after = a1
            # Only once caught up: at_end asks the broker.
            if not batch and len(seen) >= total and at_end(c1):
                break
    # A commit made while the group rebalances is refused per partition (the client
    # returns the errors, it does not raise): commit again until every partition is
    # acknowledged, as an application would.
    committed = False
    while not committed and time.time() < end:
        try:
            res = c1.commit(asynchronous=False)
            committed = all(tp.error is None for tp in res)
        except KafkaException:
            pass
        if not committed:
            c1.poll(0.2)
    c1.close()
    out({"split": split, "after_close": after, "seen": len(seen), "committed": committed})


def kafka_python(boot):
    from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition
    from kafka.admin import NewTopic

    admin = KafkaAdminClient(bootstrap_servers=boot)
    admin.create_topics([NewTopic("kp", num_partitions=2, replication_factor=1)])
    created = "kp" in admin.list_topics()
    result = {"created": created, "codecs": {}}
    codecs = ["gzip", "lz4", "zstd", "snappy"]
    base = 0
    for codec in codecs:
        try:
            p = KafkaProducer(bootstrap_servers=boot, compression_type=codec, acks="all")
        except Exception as e:  # the client lacks the codec's library
            result["codecs"][codec] = "unavailable: %s" % e
            continue
        values = [("%s-%d-" % (codec, i)).encode() * 20 for i in range(200)]
        for v in values:
            p.send("kp", key=b"k", value=v, partition=0)
        p.flush(DEADLINE_S)
        p.close()
        c = KafkaConsumer(bootstrap_servers=boot, consumer_timeout_ms=3000,
                          auto_offset_reset="earliest", enable_auto_commit=False)
        tp = TopicPartition("kp", 0)
        c.assign([tp])
        c.seek(tp, base)
        got = []
        end = time.time() + DEADLINE_S
        while len(got) < len(values) and time.time() < end:
            for m in c:
                got.append((m.offset, m.value))
                if len(got) >= len(values):
                    break
        c.close()
        ok = [v for _, v in got] == values and [o for o, _ in got] == list(range(base, base + len(values)))
        result["codecs"][codec] = "ok" if ok else "mismatch (%d records)" % len(got)
        base += len(values)
    admin.delete_topics(["kp"])
    time.sleep(0.2)
    result["deleted"] = "kp" not in admin.list_topics()
    admin.close()
    out(result)


def confluent_edges(boot, topic):
    from confluent_kafka import KafkaError, KafkaException, Producer, TopicPartition, Consumer

    result = {}
    p = Producer({"bootstrap.servers": boot, "acks": "all"})
    errs = []
    p.produce(topic, value=b"h", partition=0, headers=[("a", b"b")],
              on_delivery=lambda err, msg: errs.append(err))
    p.flush(DEADLINE_S)
    result["headers_error"] = errs[0].code() if errs and errs[0] else None
    result["headers_is_invalid_record"] = bool(errs and errs[0] and errs[0].code() == KafkaError.INVALID_RECORD)
    for ts in (1000, 2000, 3000):
        p.produce(topic, value=b"t%d" % ts, partition=0, timestamp=ts)
    p.flush(DEADLINE_S)
    c = Consumer({"bootstrap.servers": boot, "group.id": "edges"})
    result["by_time"] = [c.offsets_for_times([TopicPartition(topic, 0, ts)], timeout=10)[0].offset
                         for ts in (1500, 3000, 9000)]
    result["watermarks"] = list(c.get_watermark_offsets(TopicPartition(topic, 0), timeout=10))
    c.close()
    # A refusal must be final: librdkafka retries a retriable one until the timeout.
    began = time.time()
    try:
        t = Producer({"bootstrap.servers": boot, "transactional.id": "tx"})
        t.init_transactions(10)
        result["transactions"] = "accepted"
    except KafkaException as e:
        err = e.args[0]
        result["transactions"] = "refused: %s" % err.str()
        result["transactions_code"] = err.name()
        result["transactions_fatal"] = err.fatal()
    result["transactions_s"] = time.time() - began
    out(result)


def confluent_describe_group(boot, topic, group):
    """A member with client.id "describe-me", described by the admin client."""
    from confluent_kafka import Consumer
    from confluent_kafka.admin import AdminClient

    c = Consumer({"bootstrap.servers": boot, "group.id": group, "client.id": "describe-me"})
    c.subscribe([topic])
    end = time.time() + DEADLINE_S
    while not c.assignment() and time.time() < end:
        c.poll(0.1)
    a = AdminClient({"bootstrap.servers": boot})
    g = a.describe_consumer_groups([group])[group].result(DEADLINE_S)
    members = [{"client_id": m.client_id, "host": m.host,
                "partitions": sorted(tp.partition for tp in m.assignment.topic_partitions)}
               for m in g.members]
    c.close()
    out({"members": members})


def confluent_close_during_fetch(boot, topic):
    """A consumer at the end of partition 0 closes while its long-poll fetch waits."""
    from confluent_kafka import OFFSET_END, Consumer, TopicPartition

    c = Consumer({"bootstrap.servers": boot, "group.id": "closer", "fetch.wait.max.ms": 3000,
                  "enable.auto.commit": False})
    c.assign([TopicPartition(topic, 0, OFFSET_END)])
    end = time.time() + 2
    while time.time() < end:
        c.poll(0.2)
    c.close()
    out({"closed": True})


def confluent_static_members(boot, topic, group):
    """Two static members (group.instance.id i1, i2); i2 restarts with the same
    instance id. Reports how long the restarted one took to get its partitions back
    and the rebalance callbacks each member saw after the restart."""
    from confluent_kafka import Consumer

    events = {}

    def consumer(name, instance):
        c = Consumer({"bootstrap.servers": boot, "group.id": group, "client.id": name,
                      "group.instance.id": instance, "session.timeout.ms": 10000,
                      "heartbeat.interval.ms": 300, "enable.auto.commit": False,
                      "auto.offset.reset": "earliest"})
        events[name] = []

        def assigned(_, parts):
            events[name].append(["assign", sorted(p.partition for p in parts)])

        def revoked(_, parts):
            events[name].append(["revoke", sorted(p.partition for p in parts)])

        c.subscribe([topic], on_assign=assigned, on_revoke=revoked)
        return c

    def mine(c):
        return sorted(p.partition for p in c.assignment())

    c1, c2 = consumer("c1", "i1"), consumer("c2", "i2")
    end = time.time() + DEADLINE_S
    while time.time() < end and not (c1.assignment() and c2.assignment()):
        c1.poll(0.1)
        c2.poll(0.1)
    before = [mine(c1), mine(c2)]
    c1_seen = len(events["c1"])
    c2.close()
    began = time.time()
    c2 = consumer("c2-again", "i2")
    while time.time() < began + DEADLINE_S and not c2.assignment():
        c1.poll(0.1)
        c2.poll(0.1)
    took = time.time() - began
    after = [mine(c1), mine(c2)]
    # A little longer, for a revocation that comes late.
    settle = time.time() + 1.5
    while time.time() < settle:
        c1.poll(0.1)
        c2.poll(0.1)
    from confluent_kafka.admin import AdminClient
    admin = AdminClient({"bootstrap.servers": boot})
    g = admin.describe_consumer_groups([group])[group].result(DEADLINE_S)
    instances = sorted(m.group_instance_id for m in g.members)
    out({"before": before, "after": after, "took_s": took, "instances": instances,
         "c1_after_restart": events["c1"][c1_seen:], "c2_again": events["c2-again"]})
    c1.close()
    c2.close()


def confluent_member_across_restart(boot, topic, group):
    """One member in a Stable group. Prints {"phase": "stable", ...} once it has its
    partitions, then polls until a line on stdin says the broker restarted; then
    commits at its generation, polls a little longer for a late rebalance and reports
    the rebalance callbacks seen after the restart and what DescribeGroups shows."""
    import select
    from confluent_kafka import Consumer, KafkaException, TopicPartition
    from confluent_kafka.admin import AdminClient

    events = []
    c = Consumer({"bootstrap.servers": boot, "group.id": group, "client.id": "m1",
                  "session.timeout.ms": 30000, "heartbeat.interval.ms": 300,
                  "reconnect.backoff.max.ms": 500, "enable.auto.commit": False,
                  "auto.offset.reset": "earliest"})
    c.subscribe([topic],
                on_assign=lambda _, ps: events.append(
                    ["assign", sorted(p.partition for p in ps)]),
                on_revoke=lambda _, ps: events.append(
                    ["revoke", sorted(p.partition for p in ps)]),
                on_lost=lambda _, ps: events.append(
                    ["lost", sorted(p.partition for p in ps)]))
    end = time.time() + DEADLINE_S
    while time.time() < end and not c.assignment():
        c.poll(0.1)
    mine = sorted(p.partition for p in c.assignment())
    admin = AdminClient({"bootstrap.servers": boot})
    g = admin.describe_consumer_groups([group])[group].result(DEADLINE_S)
    before = sorted(m.member_id for m in g.members)
    out({"phase": "stable", "assignment": mine, "members": before})
    seen = len(events)
    while time.time() < end:
        c.poll(0.1)
        if select.select([sys.stdin], [], [], 0)[0]:
            sys.stdin.readline()
            break
    # An OffsetCommit at the member's generation: UNKNOWN_MEMBER_ID if the broker
    # forgot the group.
    try:
        c.commit(offsets=[TopicPartition(topic, mine[0], 0)], asynchronous=False)
        commit = "ok"
    except KafkaException as e:
        commit = str(e.args[0].name())
    settle = time.time() + 2
    while time.time() < settle:
        c.poll(0.1)
    admin = AdminClient({"bootstrap.servers": boot})
    g = admin.describe_consumer_groups([group])[group].result(DEADLINE_S)
    out({"phase": "after", "commit": commit, "events": events[seen:],
         "state": str(g.state.name), "members": sorted(m.member_id for m in g.members),
         "assignment": sorted(p.partition for p in c.assignment())})
    c.close()


class Raw:
    """Kafka requests on one socket, encoded by hand (kafka-python builds batches)."""

    def __init__(self, boot):
        import socket
        host, port = boot.rsplit(":", 1)
        self.s = socket.create_connection((host, int(port)), timeout=DEADLINE_S)
        self.corr = 0

    def call(self, key, version, body):
        import struct
        self.corr += 1
        h = struct.pack(">hhih", key, version, self.corr, 3) + b"raw"
        self.s.sendall(struct.pack(">i", len(h) + len(body)) + h + body)
        n = struct.unpack(">i", self._read(4))[0]
        r = self._read(n)
        assert struct.unpack(">i", r[:4])[0] == self.corr
        return r[4:]

    def _read(self, n):
        b = b""
        while len(b) < n:
            chunk = self.s.recv(n - len(b))
            if not chunk:
                raise EOFError("connection closed")
            b += chunk
        return b

    def init_producer_id(self):
        import struct
        r = self.call(22, 0, struct.pack(">hi", -1, 60000))
        _, err, pid, epoch = struct.unpack(">ihqh", r[:16])
        assert err == 0, err
        return pid, epoch

    def init_producer_id_v3(self, pid, epoch):
        """InitProducerId v3 (flexible) naming the producer's current id and epoch, as
        a client does to bump its epoch: (error, id, epoch)."""
        import struct
        self.corr += 1
        # Request header v2: key, version, correlation id, client id, no tags.
        h = struct.pack(">hhih", 22, 3, self.corr, 3) + b"raw" + b"\x00"
        # No transactional id (compact nullable: 0), timeout, id, epoch, no tags.
        body = b"\x00" + struct.pack(">iqh", 60000, pid, epoch) + b"\x00"
        self.s.sendall(struct.pack(">i", len(h) + len(body)) + h + body)
        n = struct.unpack(">i", self._read(4))[0]
        r = self._read(n)
        assert struct.unpack(">i", r[:4])[0] == self.corr
        # Response header v1: correlation id, tags (none); then throttle, error...
        _, err, new_pid, new_epoch = struct.unpack(">ihqh", r[5:21])
        return err, new_pid, new_epoch

    def produce(self, topic, pid, epoch, seq, n, timestamp=None):
        """One batch of n records to partition 0 (Produce v3, acks all): (error, base)."""
        import struct
        from kafka.record.default_records import DefaultRecordBatchBuilder
        b = DefaultRecordBatchBuilder(2, 0, False, pid, epoch, seq, 1 << 20)
        for i in range(n):
            ts = int(time.time() * 1000) if timestamp is None else timestamp
            b.append(i, ts, None, b"v%d" % i, [])
        recs = bytes(b.build())
        t = topic.encode()
        body = struct.pack(">hhi", -1, -1, 10000) + struct.pack(">i", 1)
        body += struct.pack(">h", len(t)) + t + struct.pack(">ii", 1, 0)
        body += struct.pack(">i", len(recs)) + recs
        r = self.call(0, 3, body)
        off = 4
        nl = struct.unpack(">h", r[off:off + 2])[0]
        off += 2 + nl + 4
        _, err, base, _ = struct.unpack(">ihqq", r[off:off + 22])
        return [err, base]

    def leave(self, group, version, members):
        """LeaveGroup: v0 names one member id; v3 (member id, instance id or None)
        pairs. The error codes: [top] or per member."""
        import struct

        def string(x):
            return struct.pack(">h", -1) if x is None else struct.pack(">h", len(x)) + x.encode()

        body = string(group)
        if version < 3:
            r = self.call(13, version, body + string(members[0][0]))
            return [struct.unpack(">h", r[4 if version >= 1 else 0:][:2])[0]]
        body += struct.pack(">i", len(members))
        for m, i in members:
            body += string(m) + string(i)
        r = self.call(13, 3, body)
        off = 4 + 2
        count = struct.unpack(">i", r[off:off + 4])[0]
        off += 4
        codes = []
        for _ in range(count):
            for _field in range(2):
                n = struct.unpack(">h", r[off:off + 2])[0]
                off += 2 + max(n, 0)
            codes.append(struct.unpack(">h", r[off:off + 2])[0])
            off += 2
        return codes


def raw_leave_unknown_group(boot):
    """LeaveGroup for a group the broker does not know, in versions 0 and 3."""
    r = Raw(boot)
    out({"v0": r.leave("never-seen", 0, [("m1", None)]),
         "v3": r.leave("never-seen", 3, [("m1", None), ("", "inst-1")])})


def raw_idempotent_epochs(boot, topic, phase, pids):
    """Idempotent batches at epochs and sequences a client may send without asking
    InitProducerId (KIP-360), across broker restarts. Phase one: two new ids A and B;
    phase two (after a restart): A at its bumped epoch; phase three (after a restart
    that expired both): B, unknown now, at sequence 0. Every answer is [error, base]."""
    r = Raw(boot)
    res = {}
    if phase == "one":
        (a, ea), (b, eb) = r.init_producer_id(), r.init_producer_id()
        res["pids"] = [a, ea, b, eb]
        res["a_first"] = r.produce(topic, a, ea, 0, 2)
        res["a_bump_seq1"] = r.produce(topic, a, ea + 1, 1, 1)
        res["a_bump_seq0"] = r.produce(topic, a, ea + 1, 0, 1)
        res["a_old_epoch"] = r.produce(topic, a, ea, 2, 1)
        res["b_first"] = r.produce(topic, b, eb, 0, 1)
        res["never_handed_out"] = r.produce(topic, a + (1 << 40), 0, 0, 1)
    elif phase == "two":
        a, ea, b, eb = pids
        res["a_bump_dup"] = r.produce(topic, a, ea + 1, 0, 1)
        res["a_bump_seq1"] = r.produce(topic, a, ea + 1, 1, 1)
        res["a_old_epoch"] = r.produce(topic, a, ea, 2, 1)
    else:
        a, ea, b, eb = pids
        # An id whose state expired asks to bump its epoch: a new id, as Kafka
        # hands one to any producer without a transactional id.
        err, new_pid, new_epoch = r.init_producer_id_v3(b, eb)
        res["b_expired_init"] = [err, new_pid > max(a, b), new_epoch]
        res["b_expired_seq1"] = r.produce(topic, b, eb, 1, 1)
        res["b_expired_seq0"] = r.produce(topic, b, eb, 0, 1)
        res["b_seq1"] = r.produce(topic, b, eb, 1, 1)
    out(res)


def raw_no_timestamp(boot, topic):
    """A record with timestamp -1 (Kafka's NO_TIMESTAMP), read back by kafka-python."""
    from kafka import KafkaConsumer, TopicPartition
    r = Raw(boot)
    before = int(time.time() * 1000)
    err, base = r.produce(topic, -1, -1, -1, 1, timestamp=-1)
    after = int(time.time() * 1000)
    c = KafkaConsumer(bootstrap_servers=boot, enable_auto_commit=False,
                      consumer_timeout_ms=10000)
    tp = TopicPartition(topic, 0)
    c.assign([tp])
    c.seek(tp, base)
    m = next(iter(c))
    c.close()
    out({"error": err, "timestamp": m.timestamp, "timestamp_type": m.timestamp_type,
         "before_ms": before, "after_ms": after})


def confluent_sasl_refusals(boot, topic, producer_token, consumer_token, ca):
    """A group refused to a producer key, InitProducerId refused to a consumer key."""
    from confluent_kafka import Consumer, KafkaException, Producer

    sasl = {"bootstrap.servers": boot, "security.protocol": "SASL_SSL",
            "sasl.mechanisms": "PLAIN", "sasl.username": "u", "ssl.ca.location": ca}
    result = {}
    c = Consumer(dict(sasl, **{"sasl.password": producer_token, "group.id": "refused"}))
    c.subscribe([topic])
    end = time.time() + DEADLINE_S
    while "group" not in result and time.time() < end:
        m = c.poll(0.2)
        if m is not None and m.error() is not None:
            result["group"] = m.error().name()
    c.close()
    errors = []
    p = Producer(dict(sasl, **{"sasl.password": consumer_token, "enable.idempotence": True,
                               "error_cb": lambda e: errors.append(e)}))
    p.produce(topic, value=b"x")
    end = time.time() + DEADLINE_S
    while not errors and time.time() < end:
        try:
            p.poll(0.2)
        except KafkaException as e:  # the fatal error, raised by poll
            errors.append(e.args[0])
    result["producer"] = [str(e) for e in errors]
    p.purge()
    out(result)


def confluent_create_kafka_configs(boot, topic):
    """CreateTopics with Kafka's config names."""
    from confluent_kafka.admin import AdminClient, NewTopic

    a = AdminClient({"bootstrap.servers": boot})
    configs = {"retention.ms": "3600000", "retention.bytes": "1048576",
               "segment.bytes": "1048576", "segment.ms": "60000",
               "cleanup.policy": "compact", "delete.retention.ms": "5000",
               "max.message.bytes": "65536"}
    try:
        a.create_topics([NewTopic(topic, 1, 1, config=configs)])[topic].result(DEADLINE_S)
        out({"created": True})
    except Exception as e:
        out({"created": False, "error": str(e)})


def bench_produce(boot, topic, n, size):
    from confluent_kafka import Producer

    p = Producer({"bootstrap.servers": boot, "acks": "all", "linger.ms": 5,
                  "queue.buffering.max.messages": 1000000})
    value = b"x" * size
    failed = []

    def cb(err, msg):
        if err is not None:
            failed.append(str(err))

    start = time.time()
    for _ in range(n):
        while True:
            try:
                p.produce(topic, value=value, on_delivery=cb)
                break
            except BufferError:
                p.poll(0.01)
    p.flush(120)
    took = time.time() - start
    out({"records": n, "seconds": took, "records_per_s": n / took, "failed": len(failed)})


def bench_fetch(boot, topic, n):
    from confluent_kafka import Consumer

    c = Consumer({"bootstrap.servers": boot, "group.id": "bench-fetch",
                  "auto.offset.reset": "earliest", "enable.auto.commit": False,
                  "fetch.max.bytes": 52428800, "max.partition.fetch.bytes": 8388608})
    c.subscribe([topic])
    got, nbytes, start = 0, 0, None
    end = time.time() + 120
    while got < n and time.time() < end:
        for m in c.consume(10000, 1.0):
            if m.error() is None:
                if start is None:
                    start = time.time()
                got += 1
                nbytes += len(m.value() or b"")
    took = time.time() - (start or time.time())
    c.close()
    out({"records": got, "seconds": took, "mb_per_s": nbytes / 1e6 / max(took, 1e-9)})


def confluent_sasl(boot, topic, token, ca, n):
    from confluent_kafka import Producer

    p = Producer({"bootstrap.servers": boot, "acks": "all", "security.protocol": "SASL_SSL",
                  "sasl.mechanisms": "PLAIN", "sasl.username": "app", "sasl.password": token,
                  "ssl.ca.location": ca})
    reports = []

    def cb(err, msg):
        reports.append((None if err is None else str(err), msg.offset()))

    for i in range(n):
        p.produce(topic, value=b"s%d" % i, on_delivery=cb)
    p.flush(DEADLINE_S)
    out({"reports": len(reports), "errors": [r[0] for r in reports if r[0] is not None][:5],
         "offsets": sorted(r[1] for r in reports)})


def confluent_metadata(boot, topic):
    from confluent_kafka import Producer

    p = Producer({"bootstrap.servers": boot})
    md = p.list_topics(topic, timeout=10)
    t = md.topics[topic]
    out({"brokers": {str(b.id): "%s:%d" % (b.host, b.port) for b in md.brokers.values()},
         "controller": md.controller_id,
         "partitions": {str(pid): {"leader": pm.leader, "replicas": list(pm.replicas),
                                   "isrs": list(pm.isrs), "error": None if pm.error is None else str(pm.error)}
                        for pid, pm in t.partitions.items()}})


def confluent_failover(boot, topic, n):
    """Produces n records (idempotent, key k<i>, value v<i>) in two halves: after the
    first is acknowledged it prints "ready" on stderr and waits for a line on stdin
    (the test kills a leader then), produces the second half, then consumes every
    partition from the start up to its high watermark."""
    from confluent_kafka import Consumer, Producer, TopicPartition

    p = Producer({"bootstrap.servers": boot, "enable.idempotence": True, "acks": "all",
                  "linger.ms": 5, "message.timeout.ms": 60000, "retry.backoff.ms": 50,
                  # Kafka's default, which the replicas' window of five batches
                  # allows (docs/PROTOCOL.md).
                  "max.in.flight.requests.per.connection": 5,
                  "topic.metadata.refresh.interval.ms": 1000})
    reports = []

    def cb(err, msg):
        reports.append((None if err is None else str(err), msg.partition(), msg.offset(),
                        msg.value().decode()))

    half = n // 2
    for i in range(n):
        if i == half:
            p.flush(DEADLINE_S)
            print("ready", file=sys.stderr)
            sys.stderr.flush()
            sys.stdin.readline()
        while True:
            try:
                p.produce(topic, key=b"k%d" % i, value=b"v%d" % i, on_delivery=cb)
                break
            except BufferError:
                p.poll(0.05)
        p.poll(0)
    p.flush(DEADLINE_S)
    parts = sorted(p.list_topics(topic, timeout=10).topics[topic].partitions)
    c = Consumer({"bootstrap.servers": boot, "group.id": "failover", "enable.auto.commit": False,
                  "topic.metadata.refresh.interval.ms": 1000})
    ends = {}
    for part in parts:
        end = time.time() + DEADLINE_S
        while time.time() < end:
            try:
                ends[part] = c.get_watermark_offsets(TopicPartition(topic, part), timeout=5)[1]
                break
            except Exception:
                time.sleep(0.2)
    c.assign([TopicPartition(topic, part, 0) for part in parts])
    consumed = []
    seen = {part: 0 for part in parts}
    end = time.time() + DEADLINE_S
    while any(seen[q] < ends.get(q, 0) for q in parts) and time.time() < end:
        m = c.poll(0.2)
        if m is not None and m.error() is None:
            consumed.append((m.partition(), m.offset(), m.value().decode()))
            seen[m.partition()] = m.offset() + 1
    c.close()
    out({"reports": reports, "consumed": consumed, "ends": {str(k): v for k, v in ends.items()}})


def confluent_group_reads(boot, topic, group, n):
    """A group member reads n records from where its group committed (earliest when
    it has not), commits them synchronously and leaves; prints the values read and
    the coordinator the client used."""
    from confluent_kafka import Consumer

    c = Consumer({"bootstrap.servers": boot, "group.id": group, "client.id": "reads",
                  "auto.offset.reset": "earliest", "enable.auto.commit": False,
                  "session.timeout.ms": 6000, "heartbeat.interval.ms": 500,
                  "topic.metadata.refresh.interval.ms": 1000})
    c.subscribe([topic])
    values = []
    errors = []
    end = time.time() + DEADLINE_S
    while len(values) < n and time.time() < end:
        m = c.poll(0.2)
        if m is None:
            continue
        if m.error() is not None:
            errors.append(str(m.error()))
            continue
        values.append(m.value().decode())
    committed = None
    while time.time() < end:
        try:
            parts = c.commit(asynchronous=False)
            committed = {str(tp.partition): tp.offset for tp in parts}
            break
        except Exception as e:  # a coordinator change under way: ask again
            errors.append(str(e))
            time.sleep(0.2)
    c.close()
    out({"values": values, "committed": committed, "errors": errors[:5]})


def main():
    mode = sys.argv[1]
    try:
        if mode == "confluent_idempotent":
            confluent_idempotent(sys.argv[2], sys.argv[3], int(sys.argv[4]))
        elif mode == "confluent_group":
            confluent_group(sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5]))
        elif mode == "confluent_edges":
            confluent_edges(sys.argv[2], sys.argv[3])
        elif mode == "bench_produce":
            bench_produce(sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]))
        elif mode == "bench_fetch":
            bench_fetch(sys.argv[2], sys.argv[3], int(sys.argv[4]))
        elif mode == "confluent_sasl":
            confluent_sasl(sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5], int(sys.argv[6]))
        elif mode == "confluent_group_reads":
            confluent_group_reads(sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5]))
        elif mode == "confluent_metadata":
            confluent_metadata(sys.argv[2], sys.argv[3])
        elif mode == "confluent_failover":
            confluent_failover(sys.argv[2], sys.argv[3], int(sys.argv[4]))
        elif mode == "confluent_describe_group":
            confluent_describe_group(sys.argv[2], sys.argv[3], sys.argv[4])
        elif mode == "confluent_static_members":
            confluent_static_members(sys.argv[2], sys.argv[3], sys.argv[4])
        elif mode == "confluent_member_across_restart":
            confluent_member_across_restart(sys.argv[2], sys.argv[3], sys.argv[4])
        elif mode == "raw_leave_unknown_group":
            raw_leave_unknown_group(sys.argv[2])
        elif mode == "raw_idempotent_epochs":
            raw_idempotent_epochs(sys.argv[2], sys.argv[3], sys.argv[4],
                                  [int(x) for x in sys.argv[5:9]])
        elif mode == "raw_no_timestamp":
            raw_no_timestamp(sys.argv[2], sys.argv[3])
        elif mode == "confluent_close_during_fetch":
            confluent_close_during_fetch(sys.argv[2], sys.argv[3])
        elif mode == "confluent_sasl_refusals":
            confluent_sasl_refusals(*sys.argv[2:7])
        elif mode == "confluent_create_kafka_configs":
            confluent_create_kafka_configs(sys.argv[2], sys.argv[3])
        elif mode == "kafka_python":
            kafka_python(sys.argv[2])
        else:
            sys.exit("unknown mode %s" % mode)
    except ImportError as e:
        print("missing client library: %s" % e, file=sys.stderr)
        sys.exit(3)


if __name__ == "__main__":
    main()
