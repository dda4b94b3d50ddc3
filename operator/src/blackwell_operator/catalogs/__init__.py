"""catalogs package."""
