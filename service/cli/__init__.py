"""The ``hallmark`` command line. Each command module registers itself on :data:`app`.

Command modules import the domain (the store, the detector, the engines) inside their
commands, so that ``hallmark --help`` and a store command load only what they use.
"""

from __future__ import annotations

from service.cli.app import app, main  # noqa: F401
# Registration order is the order `hallmark --help` lists the commands in.
from service.cli import watermark_cmds  # noqa: F401,E402  (prf, detect)
from service.cli import scan_cmd  # noqa: F401,E402  (scan)
from service.cli import tenant_cmds, key_cmds, token_cmds, audit_cmds, kek_cmds, db_cmds  # noqa: F401,E402
from service.cli import serve, generate, deploy, doctor  # noqa: F401,E402
from service.cli import provenance  # noqa: F401,E402  (ledger, receipt, signing-keys, kek status, db grant)
from service.cli import ledger_cmds  # noqa: F401,E402  (ledger verify, checkpoint, witness, init)
from service.cli import ledger_repair  # noqa: F401,E402  (ledger repair)
from service.cli import report_cmds  # noqa: F401,E402  (report verify)
from service.cli import ledger_list  # noqa: F401,E402  (ledger list)
from service.cli import witness_cmds  # noqa: F401,E402  (witness serve, key)
