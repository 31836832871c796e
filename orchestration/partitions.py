"""Daily partitions, starting at the config's data.start_date."""

import dagster as dg

from aieng_core.config import load_config

daily_partitions = dg.DailyPartitionsDefinition(start_date=load_config().data.start_date.isoformat())

# Every asset runs a partition range in one run, so `dagster asset materialize
# --partition-range A...B` works from the CLI without a daemon.
single_run = dg.BackfillPolicy.single_run()
