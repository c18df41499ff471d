"""Stubs generated from proto/palisade.proto (see clients/python/README.md, "Stubs")."""
