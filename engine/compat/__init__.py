"""Compatibility layers between libraries and the machine they run on."""
