"""The embedded demo: offline-built demo models and the in-process wiring of
edge + cloud on one machine. The only package allowed to import both sides."""
