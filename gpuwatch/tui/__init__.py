"""`gpuwatch tui`: the live terminal view of one or several machines' GPUs; and
`gpuwatch fleet`, the view of many machines, one row each.

Only `app`, `screens` and `widgets` (and the fleet's `fleet_app`, `fleet_screens`,
`fleet_widgets`) import Textual (and `gpuwatch.tcss`, with `fleet.tcss`, holds
every colour and size). The rest is plain logic,
importable and testable without it:

- `frames`: what the screen shows of one machine at one moment (`Frame`), and
  the `Source`s that produce frames on a worker thread (a backend on this
  machine, or `gpuwatch status` streamed over ssh).
- `trends`: bounded per-GPU and per-process series for the graphs, and how
  long each GPU has been idle.
- `state`: what the screen knows of each machine, fed frame by frame.
- `render`: bars, graphs, numbers and colour levels, as text spans.
- `rows`: the process table's rows (processes, leases, waiting jobs), their
  sorting and filtering, and which columns fit a width.
- `layout`: how many GPU cards per line and how tall, from the terminal size.
- `signals`: who may be signalled, and sending the signal.
- `details`: a process's parents and environment, for the detail view.
- `tree`: the tree view's order (processes under their parents).
- `training`: the training panel's lines, from `gpuwatch.torch.watch()` reports.
- `keys`: every key binding, shared by the app, its help screen and the docs.
- `fleet_rows`: a fleet's rows (one per node, free GPUs by pick's own rule), its
  totals and its users; `fleet_cells`: the fleet table's columns and cells, and
  the same table as plain text; `fleet_model`: its sort, filter and selection.
"""
