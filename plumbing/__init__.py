"""Shared plumbing every package may import (the open registry, number validators). Imports
nothing of the project, so policies/ and workloads/ can share it without importing each other."""
