"""NFS and local storage: the storage.roots settings, the scanner and the expiry walk (docs/storage.md)."""
