"""How names map between a URL's path and the objects under it: the folder prefix, upload names, relative names."""

from __future__ import annotations


def folder_prefix(path: str) -> str:
    """The listing prefix of the 'folder' a URL path names: '' for the whole container, else ending in '/'."""
    return path if not path or path.endswith("/") else path + "/"


def upload_name(dest_path: str, rel: str, *, single: bool) -> str:
    """An uploaded file's object name: for one file, the URL's path (or, if that is empty or ends in '/', that
    plus the file's name); for a folder, each relative path under the URL's path as a folder."""
    if single:
        return dest_path if dest_path and not dest_path.endswith("/") else f"{dest_path}{rel}"
    return folder_prefix(dest_path) + rel


def relative_name(prefix: str, name: str) -> str:
    """An object's name below a listing `prefix` (as local paths and filters see it)."""
    return name[len(prefix):]
