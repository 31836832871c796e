"""The daily ingest: at 01:00 UTC, the previous day's partition, through the data half."""

import dagster as dg

from orchestration.assets.data import clean_documents, raw_documents
from orchestration.assets.dataset import dataset_manifest
from orchestration.assets.tokenizer import bpe_tokenizer, tokenized_documents

daily_ingest_job = dg.define_asset_job(
    "daily_ingest",
    selection=[raw_documents, clean_documents, bpe_tokenizer, tokenized_documents, dataset_manifest],
    description="Snapshot, clean and tokenize one day, then refresh the dataset manifest (the tokenizer stays pinned).",
)

# A daily-partitioned job's schedule requests the partition of the day that just ended.
daily_ingest_schedule = dg.build_schedule_from_partitioned_job(daily_ingest_job, hour_of_day=1, minute_of_hour=0)
