"""Detection access tiers around the one detection core (:func:`service.detection.detect`).

The core always computes the full-precision result; this package decides what each caller
may see and how much it may ask:

- :mod:`service.access.tiers`: who is asking (public, tenant, expert, operator) and that
  tier's policy;
- :mod:`service.access.shape`: the full result cut down to a tier's answer, re-signed so that
  the signed report states only what the tier saw;
- :mod:`service.access.budgets`: budgets charged per token scored, shared by every replica
  through the database;
- :mod:`service.access.probe`: the probe guard (keyed k-gram hashes of a principal's recent
  queries, deleted after 24 hours; never text);
- :mod:`service.access.slots`: concurrent detections per principal, taken before any work;
- :mod:`service.access.lanes`: one detection per principal at a time; a principal over its
  share of recent lane time lets others' detections in flight go first;
- :mod:`service.access.offload`: large bodies detected in worker processes at a lower CPU
  priority than the gateway;
- :mod:`service.access.group_commit`: the gate's writes, committed in groups off the event loop;
- :mod:`service.access.gate`: the order these run in, for the routes.
"""
