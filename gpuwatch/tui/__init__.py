"""The terminal screens, in three rooms: `node` (`gpuwatch tui`, the live view of one or
several machines' GPUs), `fleet` (`gpuwatch fleet`, many machines, one row each) and
`common`, what both are built from. Neither app imports the other's room.

In each room, only the apps, screens and widgets import Textual (named in the layer
contract of pyproject.toml); the logic beside them is plain Python, importable and tested
without a terminal. `common.tcss` holds the colours of both, `node.tcss` and `fleet.tcss`
each app's own sizes.

- `common`: `app` (`TableApp`: the one set of table actions, sort, filter, select, open),
  `table` (`RowTable`: the one table widget), `widgets` (painted text, a machine's GPU
  cards), `screens` (the help); and the logic: `render` (bars, graphs, cards as spans),
  `cards` (a machine's cards laid out), `section` (what a screen knows of one machine),
  `frames`, `trends`, `layout`, `columns`, `view` (sort and selection), `keys`.
- `node`: `app` (`GpuwatchApp`), `screens` (detail, signal confirmation), `widgets` (host
  line, panels), `sampler` (the sampling threads); and the logic: `sources` (a backend
  here, or `gpuwatch status` over ssh), `state`, `rows`, `model`, `tree`, `signals`,
  `details`, `training`, `keys`.
- `fleet`: `app` (`FleetApp`), `screens` (a node's cards, the users); and the logic:
  `rows` (one per node, free GPUs by pick's own rule), `cells`, `model`, `node_cards`,
  `keys`.
"""
