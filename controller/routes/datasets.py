"""Datasets: register one (an upload, a file under controller.path_roots, a Hugging Face dataset), list
them, read one. Every way in ends in the same read budget, normalisation and content-hash registration."""

from __future__ import annotations

import os
import uuid
from pathlib import Path
from typing import Any, Literal

from fastapi import APIRouter, File, Form, Query, UploadFile
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from controller import datasets as ds
from controller import sources, store
from controller.routes.common import ERRORS, links, reply
from controller.routes.deps import READ, WRITE, Ctl
from controller.service import Controller
from controller.store import ApiError
from shared.io.jsonl import JSONInputError, loads_strict

router = APIRouter(prefix="/v1", responses=ERRORS)


class PathDataset(BaseModel):
    model_config = ConfigDict(extra="forbid")
    path: str = Field(description="A JSONL (plain, .gz, .bz2, .xz) or Parquet file under controller.path_roots "
                      "(a relative path: from the first root).", min_length=1, max_length=4096)
    name: str = Field("", max_length=256, description="Display name ('' = the file name).")
    format: Literal["auto", "jsonl", "parquet"] = "auto"
    mapping: ds.FieldMapping = Field(default_factory=ds.FieldMapping)


class HfDataset(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(description="Hub id (gsm8k), a local dataset dir (/... or ./..., under controller.path_roots), "
                      "or a builder (json, parquet, csv, text, ...) with data_files under controller.path_roots.",
                      min_length=1, max_length=512)
    split: str = Field("train", min_length=1, max_length=128)
    subset: str | None = Field(None, max_length=128, description="Dataset config name (e.g. 'main' for gsm8k).")
    data_files: list[str] | None = Field(None, max_length=1000)
    revision: str | None = Field(None, max_length=128)
    display_name: str = Field("", max_length=256)
    mapping: ds.FieldMapping = Field(default_factory=ds.FieldMapping)


def _budget(ctl: Controller, source_bytes: int | None) -> ds.ReadBudget:
    return ds.ReadBudget(ctl.ccfg.max_dataset_mb << 20, ctl.ccfg.max_expansion_ratio, source_bytes)


def _normalize(ctl: Controller, path: Path, fmt: str, filename: str, mapping: ds.FieldMapping, name: str,
               source: str, ref: str) -> tuple[dict, bool]:
    if fmt == "auto":
        fmt = ds.sniff_format(path, filename)
    budget = _budget(ctl, path.stat().st_size)
    if fmt == "parquet":
        rows, unit = ds.read_parquet(path, budget, ctl.ccfg.max_line_kb * 1024), "row"
    else:
        rows, unit = ds.read_jsonl(path, ctl.ccfg.max_line_kb * 1024, budget), "line"
    norm = ds.normalize(rows, mapping, ctl.data_dir / "datasets", max_errors=ctl.ccfg.max_errors,
                        max_row_bytes=ctl.ccfg.max_line_kb * 1024, unit=unit)
    return store.register_dataset(ctl.Session, norm, name, source, ref, fmt)


def _parse_mapping(text: str) -> ds.FieldMapping:
    if not text.strip():
        return ds.FieldMapping()
    try:
        return ds.FieldMapping.model_validate(loads_strict(text))
    except JSONInputError as exc:
        raise ApiError(422, f'mapping: {exc}: send e.g. {{"prompt": "question"}}') from None
    except ValidationError as exc:
        e = exc.errors()[0]
        field = ".".join(str(p) for p in e["loc"]) or "mapping"
        raise ApiError(422, f"mapping.{field}: {e['msg']} (keys: prompt, messages, reference, metadata)") from None


@router.post("/datasets", dependencies=WRITE, status_code=201, summary="Register a dataset by upload",
             operation_id="uploadDataset", openapi_extra=links({"getDataset": {"dataset": "$response.body#/id"}}))
def upload_dataset(ctl: Ctl, file: UploadFile = File(description="JSONL (one JSON object per line) or Parquet."),
                   name: str = Form("", max_length=256), format: Literal["auto", "jsonl", "parquet"] = Form("auto"),
                   mapping: str = Form("", max_length=100_000,
                                       description='Field mapping as JSON, e.g. {"prompt": "question"}')):
    fm = _parse_mapping(mapping)
    limit = ctl.ccfg.max_upload_mb * 1024 * 1024
    tmp = ctl.data_dir / "uploads" / f"{uuid.uuid4().hex}.part"
    try:
        size = 0
        with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "wb") as out:
            while chunk := file.file.read(1 << 20):
                size += len(chunk)
                if size > limit:
                    raise ApiError(413, f"upload is over {ctl.ccfg.max_upload_mb} MiB (controller.max_upload_mb): "
                                        f"raise the limit or register the file by server-side path")
                out.write(chunk)
        fname = file.filename or "upload"
        return reply(*_normalize(ctl, tmp, format, fname, fm, name or fname, "upload", fname))
    finally:
        tmp.unlink(missing_ok=True)


@router.post("/datasets/path", dependencies=WRITE, status_code=201, summary="Register a dataset by server-side path",
             operation_id="registerDatasetPath", openapi_extra=links({"getDataset": {"dataset": "$response.body#/id"}}))
def path_dataset(ctl: Ctl, req: PathDataset):
    p = sources.confine(req.path, ctl.ccfg.path_roots)  # one 403 for missing, unreadable and outside
    if p.stat().st_size > ctl.ccfg.max_upload_mb * 1024 * 1024:
        raise ApiError(413, f"{req.path!r} is over {ctl.ccfg.max_upload_mb} MiB (controller.max_upload_mb)")
    return reply(*_normalize(ctl, p, req.format, p.name, req.mapping, req.name or p.name, "path", str(p)))


@router.post("/datasets/hf", dependencies=WRITE, status_code=201, summary="Register a Hugging Face dataset")
def hf_dataset(ctl: Ctl, req: HfDataset):
    cache = ds.private_dir(Path(ctl.ccfg.hf_cache_dir or ctl.data_dir / "hf-cache"))
    name, data_files, size = sources.hf_source(req.name, req.data_files, ctl.ccfg.path_roots)
    rows = sources.read_hf(name, req.split, req.subset, data_files, req.revision, str(cache), _budget(ctl, size),
                           ctl.ccfg.max_line_kb * 1024)
    try:
        norm = ds.normalize(rows, req.mapping, ctl.data_dir / "datasets", max_errors=ctl.ccfg.max_errors,
                            max_row_bytes=ctl.ccfg.max_line_kb * 1024, unit="row")
    finally:
        ds.private_tree(cache)
    ref = f"hf:{req.name}" + (f"/{req.subset}" if req.subset else "") + f"[{req.split}]"
    return reply(*store.register_dataset(ctl.Session, norm, req.display_name or ref, "hf", ref, "hf"))


@router.get("/datasets", summary="List datasets", dependencies=READ)
def list_datasets(ctl: Ctl, limit: int = Query(100, ge=1, le=10_000)) -> list[dict[str, Any]]:
    from sqlalchemy import select

    from controller.db import Dataset

    with ctl.Session() as s:
        return [store.dataset_dict(d) for d in s.scalars(select(Dataset).order_by(Dataset.id).limit(limit))]


@router.get("/datasets/{dataset}", summary="One dataset (id, content hash or name)", dependencies=READ,
            operation_id="getDataset")
def get_dataset(ctl: Ctl, dataset: str) -> dict[str, Any]:
    with ctl.Session() as s:
        return store.dataset_dict(store.find_dataset(s, dataset))
