"""Post-run analytics over the SQL store: makespan, lower bound, tail, phases, utilisation, reports.

Entry points: `summary.summarize`, `report.write_report`, `artifacts.publish_batch_artifacts`,
`eta.estimate_eta`. See docs/dashboards.md.

Imports: scheduling, protocols, traces, db, sim.
"""
