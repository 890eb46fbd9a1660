"""Small helpers shared by every layer (no imports of the layers above)."""
