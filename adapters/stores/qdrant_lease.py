"""A writer lease for a Qdrant server collection: one writer at a time across machines.

A server has no file to ``flock``, so the lease is one point in a small collection of its own
(``<collection>-vecplug-writer``), taken and renewed by Qdrant's conditional upsert
(``update_filter``: a point that exists is replaced only if it matches; one that does not
exist is inserted) with strong write ordering, which makes each step a compare-and-set on
that point:

* **take**: write ``{owner: <this writer's token>, host, pid, expires}`` on condition that the
  point is absent, is ours, has lapsed (``expires`` in the past), or belongs to a process of
  this host that no longer runs (a writer killed on this machine frees it at once); then read
  it back: ours, or :class:`~vecplug.errors.IndexLockedError` naming the holder;
* **keep**: before each write request (one store call may send many), once a quarter of the
  lease has passed since it was last renewed, renew it on condition that it is still ours (so
  every request goes out with at least three quarters of it left); a lease another writer took
  after ours lapsed (this writer was idle past it), even one that writer has since given back,
  is an IndexLockedError before anything is written;
* **give back** at close: on condition that it is still ours, make it lapse (``expires`` 0),
  not delete it: a missing point is inserted by any conditional upsert, so a writer idle past
  its lease would take a deleted one back at its next renewal.

Limits: a writer stopped for longer than the lease in the middle of one write (a frozen VM)
can still write after another took over (no fencing token); the commit check of
``_Server.commit`` then refuses its commit. Lapses are judged by each client's clock: clocks
apart by more than the lease break it (the default is 60 s). Servers older than the
conditional upsert (Qdrant 1.16) ignore or refuse the condition.
"""
from __future__ import annotations

import os
import socket
import time
import uuid
from collections.abc import Callable
from datetime import datetime, timezone
from typing import Any

from vecplug.errors import IndexLockedError
from vecplug.fsutil import process_running

#: seconds a lease lasts unless renewed (``options["lease_seconds"]``)
LEASE_SECONDS = 60.0
_POINT = 1  # the lease's point id in its collection


def lease_held(client: Any, collection: str, call: Callable[..., Any]) -> bool:
    """Whether a writer holds the lease on ``collection`` now (not lapsed, nor given back, nor
    left by a killed writer of this host)."""
    name = f"{collection}-vecplug-writer"
    if not call(client.collection_exists, name):
        return False
    points = call(client.retrieve, name, [_POINT], with_payload=True, with_vectors=False)
    held = (points[0].payload or {}) if points else {}
    expires = held.get("expires")
    if not isinstance(expires, (int, float)) or expires < time.time():
        return False
    return not (held.get("host") == socket.gethostname() and isinstance(held.get("pid"), int)
                and not process_running(held["pid"]))


class WriterLease:
    """The lease of one writer on one server collection (see the module docstring).

    ``call`` runs a client method with the store's retries; ``where`` names the collection."""

    def __init__(self, client: Any, models: Any, collection: str, where: str,
                 call: Callable[..., Any], seconds: float = LEASE_SECONDS) -> None:
        self.client, self.m, self.call = client, models, call
        self.name = f"{collection}-vecplug-writer"
        self.where = where
        self.seconds = float(seconds)
        self.token = uuid.uuid4().hex
        self.host = socket.gethostname()
        self.renewed: float | None = None  # time.time() of the last take or renewal

    def _holder(self) -> dict[str, Any] | None:
        points = self.call(self.client.retrieve, self.name, [_POINT], with_payload=True,
                           with_vectors=False)
        return (points[0].payload or {}) if points else None

    def _write(self, condition: Any) -> None:
        now = time.time()
        payload = {"owner": self.token, "host": self.host, "pid": os.getpid(),
                   "expires": now + self.seconds}
        self.call(self.client.upsert, self.name, [self.m.PointStruct(id=_POINT, vector=[1.0], payload=payload)],
                  wait=True, ordering=self.m.WriteOrdering.STRONG, update_filter=condition)
        self.renewed = now

    def _is(self, key: str, value: Any) -> Any:
        return self.m.FieldCondition(key=key, match=self.m.MatchValue(value=value))

    def take(self) -> None:
        """Take the lease, or raise IndexLockedError naming the writer that holds it."""
        m = self.m
        if not self.call(self.client.collection_exists, self.name):
            try:
                self.call(self.client.create_collection, self.name,
                          vectors_config=m.VectorParams(size=1, distance=m.Distance.COSINE))
            except Exception:
                if not self.call(self.client.collection_exists, self.name):
                    raise  # else another writer made it first
        free = [self._is("owner", self.token), m.FieldCondition(key="expires", range=m.Range(lt=time.time()))]
        held = self._holder()
        if held and held.get("host") == self.host and isinstance(held.get("pid"), int) \
                and not process_running(held["pid"]) and isinstance(held.get("owner"), str):
            free.append(self._is("owner", held["owner"]))  # a killed writer of this machine
        self._write(m.Filter(should=free))
        self._check("is being written by another writer")

    def keep(self) -> None:
        """Before a write: renew the lease once a quarter of it has passed; IndexLockedError if
        another writer holds it now."""
        if self.renewed is not None and time.time() < self.renewed + self.seconds / 4:
            return
        self._write(self.m.Filter(must=[self._is("owner", self.token)]))
        self._check("was taken over by another writer while this one was idle past its lease")

    def _check(self, what: str) -> None:
        held = self._holder()
        if held is not None and held.get("owner") == self.token:
            return
        self.renewed = None
        who = (f"{held.get('host')} pid {held.get('pid')}" if held else "unknown")
        until = ""
        if held and isinstance(held.get("expires"), (int, float)):
            at = datetime.fromtimestamp(held["expires"], timezone.utc).strftime("%H:%M:%S UTC")
            until = f"; its lease ends at {at} unless that writer renews it"
        raise IndexLockedError(
            f"{self.where} {what} ({who}{until}). A Qdrant server collection takes one writer at "
            f"a time: a writer renews its lease while it writes and gives it back when it closes; "
            f"one killed on another machine leaves it to lapse within {self.seconds:g} s")

    def give_back(self) -> None:
        """End the lease if it is still ours (never another writer's): it lapses now, under our
        name. Not deleted: a conditional upsert inserts a point that is missing, so a writer
        idle past its lease would take a deleted one back at its next renewal, after another
        writer had written and committed in between."""
        if self.renewed is None:
            return
        self.renewed = None
        point = self.m.PointStruct(id=_POINT, vector=[1.0], payload={
            "owner": self.token, "host": self.host, "pid": os.getpid(), "expires": 0.0})
        self.call(self.client.upsert, self.name, [point], wait=True, ordering=self.m.WriteOrdering.STRONG,
                  update_filter=self.m.Filter(must=[self._is("owner", self.token)]))
