"""The gateway's routes, one ``APIRouter`` per concern; :func:`service.app.create_app` wires them.

A route parses the request, calls a domain function (:mod:`service.generation`,
:mod:`service.detection`, :mod:`ledger.entries`) and maps the result to a response.
Dependencies are the ``Annotated`` aliases of :mod:`service.routes.deps`.
"""
