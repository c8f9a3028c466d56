"""data.yaml → DataConfig.

Path rules (all documented for users):
- `path` (the dataset root) that is relative resolves against the folder of the YAML file itself,
  never the current directory; a missing `path` means the YAML's own folder.
- `train` / `val` / `test` are a folder, a list file (.txt of image paths) or an image, or a list of
  these; relative entries resolve against the root.
- `root_override` replaces the root, e.g. with a SageMaker channel folder: a data.yaml written for
  `/home/me/data` then works when the channel is mounted at `/opt/ml/input/data/training`. Absolute
  `train`/`val`/`test` entries under the YAML's original `path` are rebased onto the override as well.
- COCO form: a split that is one `.json` file is a COCO instances file (see `data.coco`); its images'
  `file_name`s resolve against `<split>_images:` (`train_images`, `val_images`, `test_images`; a folder,
  resolved like the entries) or, without it, the JSON's folder. Class names (and `nc`) then come from
  the JSON's `categories` (ascending id); `names`, when given too, must agree with them.
"""

from __future__ import annotations

import errno
from dataclasses import dataclass, field
from pathlib import Path

from yolov5_smddp.data.coco import is_coco_json
from yolov5_smddp.errors import DataError
from yolov5_smddp.files.bounded_read import shown
from yolov5_smddp.files.bounded_yaml import load_yaml

SPLIT_KEYS = ("train", "val", "test")


@dataclass(frozen=True, kw_only=True)
class DataConfig:
    """A resolved data.yaml."""

    yaml_path: Path
    """The YAML file this was read from (absolute)."""
    root: Path
    """The dataset root every relative entry resolved against (absolute)."""
    train: list[Path]
    """Training sources: folders, list files or images (absolute, existing)."""
    val: list[Path]
    """Validation sources (absolute, existing)."""
    test: list[Path]
    """Optional test sources (absolute, existing); empty when the YAML has none."""
    names: list[str]
    """Class names, index = class id."""
    nc: int
    """Number of classes (= len(names))."""
    image_dirs: dict[str, Path] = field(default_factory=dict)
    """COCO splits: split -> the folder the JSON's `file_name`s are relative to (absent: the JSON's)."""


def _class_name(value: object, entry: str, yaml_path: Path) -> str:
    """One class name: a non-empty string (a number is taken as its text). YAML 1.1 reads unquoted
    yes/no/on/off/true/false as booleans and an empty entry as null: those are errors that say so."""
    if isinstance(value, str) and value.strip():
        return value
    if isinstance(value, int | float) and not isinstance(value, bool):
        return str(value)
    if isinstance(value, bool):
        why = f"the boolean {value} (YAML reads unquoted yes/no/on/off/true/false as booleans)"
    elif value is None:
        why = "empty (null)"
    elif isinstance(value, str):
        why = "an empty string"
    else:
        why = f"a {type(value).__name__} ({str(value)[:60]}), not a name"
    raise DataError(
        f"{shown(yaml_path)}: key 'names': {entry} is {why}; class names must be non-empty strings: "
        f'quote them, e.g. names: ["NO", "yes"]'
    )


def _parse_names(raw: object, yaml_path: Path) -> list[str]:
    if isinstance(raw, list):
        return [_class_name(name, f"entry {i}", yaml_path) for i, name in enumerate(raw)]
    if isinstance(raw, dict):
        try:
            ids = sorted(int(key) for key in raw)
        except (TypeError, ValueError) as exc:
            raise DataError(
                f"{yaml_path}: key 'names': dict keys must be class ids 0..n-1, got {list(raw)}"
            ) from exc
        if ids != list(range(len(ids))):
            raise DataError(
                f"{yaml_path}: key 'names': class ids must be 0..{len(ids) - 1} without gaps, got {ids}"
            )
        by_id = {int(key): _class_name(value, f"id {key}", yaml_path) for key, value in raw.items()}
        return [by_id[i] for i in ids]
    raise DataError(
        f"{yaml_path}: key 'names' must be a list or a {{id: name}} dict, got {type(raw).__name__}"
    )


def _resolved(path: Path, about: str) -> Path:
    """`path` made absolute with its links resolved; DataError naming `about` when a link loops (a strict
    resolve raises RuntimeError (Python 3.11) or OSError ELOOP (3.13) there; a plain one returns the loop's
    path unresolved on 3.13). A path that does not exist resolves as far as it goes."""
    try:
        return path.resolve(strict=True)
    except RuntimeError as exc:
        raise DataError(f"{about}: {shown(path)} is a symbolic link loop ({exc})") from None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise DataError(f"{about}: {shown(path)} is a symbolic link loop ({exc.strerror})") from None
        return path.resolve()  # missing or not accessible: the caller's own check names it


def _resolve_entry(entry: str, root: Path, original_root: Path | None, about: str) -> Path:
    path = Path(entry).expanduser()
    if not path.is_absolute():
        return _resolved(root / path, about)
    if original_root is not None and path.is_relative_to(original_root):
        return _resolved(root / path.relative_to(original_root), about)
    return _resolved(path, about)


def load_data_config(
    yaml_path: str | Path, root_override: Path | None = None, cache_dir: Path | None = None
) -> DataConfig:
    """Read and validate a data.yaml; see the module docstring for how paths resolve. A COCO JSON given
    instead of a data.yaml is read as the `val` (and `train`) split of a dataset of its own
    (`coco_data_config`). `cache_dir`: where a COCO JSON's parse is cached (None: the default folder).

    Raises DataError naming the YAML file and the key for a missing file, bad YAML, missing splits,
    sources that do not exist, or `nc` that disagrees with `names`.
    """
    yaml_path = _resolved(Path(yaml_path).expanduser(), "data.yaml")
    if not yaml_path.exists():
        raise DataError(f"data.yaml not found: {shown(yaml_path)}")
    if is_coco_json(yaml_path):
        return coco_data_config(yaml_path, cache_dir)
    raw = load_yaml(yaml_path, DataError)
    if not isinstance(raw, dict):
        raise DataError(
            f"{yaml_path}: expected a mapping with keys path/train/val/names, got {type(raw).__name__}"
        )

    yaml_root = raw.get("path")
    if yaml_root is not None and not isinstance(yaml_root, str):
        raise DataError(f"{yaml_path}: key 'path' must be a string, got {yaml_root!r}")
    declared_root = Path(yaml_root).expanduser() if yaml_root else Path(".")
    if not declared_root.is_absolute():
        declared_root = yaml_path.parent / declared_root
    declared_root = _resolved(declared_root, f"{shown(yaml_path)}: key 'path'")
    if root_override is not None:
        root = _resolved(Path(root_override).expanduser(), "the dataset root")
        original_root = declared_root
    else:
        root, original_root = declared_root, None
    if not root.is_dir():
        raise DataError(f"{yaml_path}: key 'path': dataset root {root} is not a folder")

    splits: dict[str, list[Path]] = {}
    for key in SPLIT_KEYS:
        value = raw.get(key)
        if value is None or value == "":
            if key in ("train", "val"):
                raise DataError(
                    f"{yaml_path}: key '{key}' is missing (a folder, list file, or a list of them)"
                )
            splits[key] = []
            continue
        entries = value if isinstance(value, list) else [value]
        resolved = []
        for entry in entries:
            if not isinstance(entry, str):
                raise DataError(f"{yaml_path}: key '{key}': entries must be paths, got {entry!r}")
            path = _resolve_entry(entry, root, original_root, f"{shown(yaml_path)}: key '{key}'")
            if not path.exists():
                raise DataError(f"{yaml_path}: key '{key}': {path} does not exist (root {root})")
            resolved.append(path)
        splits[key] = resolved

    image_dirs = {}
    for key in SPLIT_KEYS:
        value = raw.get(f"{key}_images")
        if value is None:
            continue
        if not (len(splits[key]) == 1 and is_coco_json(splits[key][0])):
            raise DataError(
                f"{yaml_path}: key '{key}_images' is only for a '{key}' that is one COCO .json file"
            )
        if not isinstance(value, str):
            raise DataError(f"{yaml_path}: key '{key}_images' must be a folder path, got {value!r}")
        folder = _resolve_entry(value, root, original_root, f"{shown(yaml_path)}: key '{key}_images'")
        if not folder.is_dir():
            raise DataError(f"{yaml_path}: key '{key}_images': {folder} is not a folder (root {root})")
        image_dirs[key] = folder

    coco_names = _coco_names(splits, yaml_path, cache_dir)
    if coco_names is not None:
        if "names" in raw and _parse_names(raw["names"], yaml_path) != coco_names:
            raise DataError(
                f"{yaml_path}: key 'names' {_parse_names(raw['names'], yaml_path)} disagrees with the COCO "
                f"JSON's categories {coco_names} (leave 'names' out: they come from the JSON)"
            )
        names = coco_names
    elif "names" in raw:
        names = _parse_names(raw["names"], yaml_path)
    elif isinstance(raw.get("nc"), int):
        names = [f"class{i}" for i in range(raw["nc"])]
    else:
        raise DataError(f"{yaml_path}: key 'names' is missing (a list of class names)")
    if not names:
        raise DataError(f"{yaml_path}: key 'names' is empty")
    if "nc" in raw and raw["nc"] != len(names):
        raise DataError(f"{yaml_path}: key 'nc' is {raw['nc']!r} but 'names' lists {len(names)} classes")

    return DataConfig(
        yaml_path=yaml_path,
        root=root,
        train=splits["train"],
        val=splits["val"],
        test=splits["test"],
        names=names,
        nc=len(names),
        image_dirs=image_dirs,
    )


def _coco_categories(json_path: Path, cache_dir: Path | None) -> tuple[list[int], list[str]]:
    from yolov5_smddp.data.cache import choose_cache_dir
    from yolov5_smddp.data.coco import load_coco

    table, _ = load_coco(json_path, choose_cache_dir(cache_dir))
    return table.category_ids.tolist(), table.names


def _coco_names(splits: dict[str, list[Path]], yaml_path: Path, cache_dir: Path | None) -> list[str] | None:
    """The class names of the COCO JSON splits (None when there are none); every JSON must list the
    same categories (ids and names), else a DataError naming both files."""
    found = None
    for key in SPLIT_KEYS:
        entries = splits[key]
        if not any(is_coco_json(p) for p in entries):
            continue
        if len(entries) != 1:
            raise DataError(
                f"{yaml_path}: key '{key}': a COCO JSON split is one .json file, got {len(entries)} entries"
            )
        categories = _coco_categories(entries[0], cache_dir)
        if found is None:
            found = (entries[0], categories)
        elif categories != found[1]:
            raise DataError(
                f"{yaml_path}: {entries[0]} lists categories (ids, names) {categories}, but {found[0]} lists "
                f"{found[1]}: every split must use the same categories"
            )
    return None if found is None else found[1][1]


def coco_data_config(json_path: Path, cache_dir: Path | None = None) -> DataConfig:
    """A dataset of one COCO JSON (e.g. `val --data instances_val.json`): its `file_name`s relative to
    the JSON's folder, names from its categories; it is the `val` and the `train` split."""
    json_path = Path(json_path).expanduser().resolve()
    _ids, names = _coco_categories(json_path, cache_dir)
    return DataConfig(
        yaml_path=json_path,
        root=json_path.parent,
        train=[json_path],
        val=[json_path],
        test=[],
        names=names,
        nc=len(names),
    )
