"""openshell-sandbox."""
