"""Agents built on the public extension API only, as a package of yours would be (docs/extending.md)."""
