"""The dashboard's widgets and screens."""
