"""The collector's own status page (/ui): fleet, straggler episode and node views, read-only,
server-rendered with SVG charts (docs/ui.md)."""
