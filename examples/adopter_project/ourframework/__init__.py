"""A framework that keeps its weight versions on the client side (it never stamps the engines)."""
