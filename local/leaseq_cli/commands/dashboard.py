"""leaseq dashboard: the web dashboard on 127.0.0.1, over the embedded server or DATABASE_URL.

It serves the same Powertools resolver as the dashboard Lambda: each local request is
turned into a function URL event whose IAM principal is ``local:$USER``, given the role
chosen here (operator by default: it is your own machine and your own database login).

That login may be the production database's (``--stack``), so the server lets in only
whoever started it (:mod:`leaseq_dashboard.local_door`): the URL printed here carries a
key made for this run, which the first visit exchanges for a cookie. It is printed on
this terminal and nowhere else (not on the command line, not in a file).
"""

from __future__ import annotations

import argparse
import getpass
import sys
from collections.abc import Callable

from leaseq import connect
from leaseq.store.db import Connection
from leaseq_dashboard import AccessPolicy, build
from leaseq_dashboard.local import ConnectionViewSource, LocalServer

from leaseq_cli.commands._shared import target_for
from leaseq_cli.failures import UsageError
from leaseq_cli.render import Ui


def local_principal() -> str:
    """Who the local dashboard says is looking (the audit events' actor)."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = "unknown"
    return f"local:{user}"


def cmd_dashboard(args: argparse.Namespace, ui: Ui) -> int:
    principal = local_principal()
    reader: Callable[[], Connection] | None = None
    if args.role == "tenant":
        if args.tenant is None or not args.reader_url:
            raise UsageError("--as tenant needs --tenant UUID and --reader-url (a login in "
                             "authenticated, bound to that tenant in app.tenant_readers)")
        reader_url = str(args.reader_url)
        policy = AccessPolicy(tenant_viewers={principal: args.tenant})

        def open_reader() -> Connection:
            return connect(reader_url, application_name="leaseq-dashboard")
        reader = open_reader
    elif args.role == "viewer":
        policy = AccessPolicy(viewers=(principal,))
    else:
        policy = AccessPolicy(operators=(principal,))
    target = target_for(args, ui)
    source = ConnectionViewSource(
        lambda: target.connect_worker("leaseq-dashboard"),
        reader)
    server = LocalServer(build(source, policy, secure_cookies=False), principal=principal,
                         port=args.port,
                         log=(lambda line: print(line, file=sys.stderr)) if args.verbose_http
                         else (lambda line: None))
    print(f"leaseq dashboard on {server.login_url} as {principal} ({args.role}), "
          f"over the {target.description}; open this URL (its key, new at every start, "
          "is what lets a browser in); Ctrl-C stops it", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.httpd.server_close()
        source.close()
    return 0
