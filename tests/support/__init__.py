"""What more than one test area uses: manifests, plans, specs, schemas, small models and data, the chart's
render (no tests here; tests/repo/test_areas.py keeps every area's own modules its own)."""
