"""Seconds the slow tests took in a measured run of ``make test`` (the main pass),
for the schedule in tests/support/schedule.py: the files with the most seconds are
queued first. Only tests of ``SLOW_S`` or more are listed; every other test counts
``DEFAULT_S``. Measured on 2026-11-27 (branch wt/h1-32 baseline, three workers on 2
cores at a load average of 4 to 20; the two-broker kill test is listed under its
file of now). A new slow test belongs here (its figure from ``--durations``); a
wrong figure costs only wall time, never a result."""

from __future__ import annotations

SLOW_S = 8
DEFAULT_S = 0.5

SECONDS: dict[str, float] = {
    "tests/bench/test_bench_quick.py::test_quick_run_prints_its_tables[broker_ab]": 21,
    "tests/bench/test_bench_quick.py::test_quick_run_prints_its_tables[broker_bench]": 14,
    "tests/bench/test_bench_quick.py::test_quick_run_prints_its_tables[delay_bench]": 30,
    "tests/bench/test_bench_quick.py::test_quick_run_prints_its_tables[filter_bench]": 11,
    "tests/bench/test_bench_quick.py::test_quick_run_prints_its_tables[key_index_bench]": 14,
    "tests/bench/test_bench_quick.py::test_quick_run_prints_its_tables[replication_bench]": 9,
    "tests/bench/test_bench_quick.py::test_quick_run_prints_its_tables[restart_bench]": 10,
    "tests/bench/test_bench_quick.py::test_quick_run_prints_its_tables[spark_pushdown_bench]": 90,
    "tests/bench/test_bench_quick.py::test_quick_run_prints_its_tables[storage_bench]": 9,
    "tests/bench/test_bench_quick.py::test_quick_run_prints_its_tables[timer_pending]": 10,
    "tests/bench/test_bench_quick.py::test_quick_run_prints_its_tables[wire_shape_bench]": 10,
    "tests/bench/test_bench_quick_spark.py::test_quick_run_prints_its_tables[cluster_bench]": 118,
    "tests/bench/test_bench_quick_spark.py::test_quick_run_prints_its_tables[spark_bench]": 242,
    "tests/bench/test_metrics_bench.py::test_quick_run_prints_every_arm": 15,
    "tests/broker/test_budgets.py::"
    "test_concurrent_full_size_produces_are_received_within_the_intake_budget": 10,
    "tests/broker/test_damaged_records.py::test_get_message_does_not_serve_a_damaged_record": 9,
    "tests/broker/test_delayed_restarts.py::"
    "test_delayed_messages_survive_kills_and_are_delivered_once": 61,
    "tests/broker/test_deny_service.py::"
    "test_silent_connections_leave_room_for_clients_that_speak": 10,
    "tests/broker/test_metrics_paths.py::test_connections_and_calls_in_flight": 23,
    "tests/broker/test_query_keys.py::test_million_keyed_messages_across_restart_and_rebuild": 110,
    "tests/broker/test_security.py::test_spark_connector_passes_token_and_tls": 123,
    "tests/broker/test_txn_checks.py::test_a_broker_killed_between_checks_continues_the_count": 15,
    "tests/broker/test_txn_checks.py::"
    "test_a_checker_answering_commit_makes_the_transaction_visible": 12,
    "tests/broker/test_txn_checks.py::"
    "test_a_token_is_asked_only_about_its_own_transactions_by_the_ids_it_knows": 14,
    "tests/broker/test_txn_checks.py::"
    "test_unknown_answers_and_raising_checkers_are_asked_again[raise-then-commit]": 11,
    "tests/broker/test_txn_checks.py::"
    "test_unknown_answers_and_raising_checkers_are_asked_again[unknown-then-commit]": 10,
    "tests/broker/test_txn_checks.py::test_with_keep_an_exhausted_transaction_stays_open": 12,
    "tests/broker/test_txn_checks.py::"
    "test_without_a_producer_the_transaction_is_rolled_back_after_the_last_check": 10,
    "tests/client/test_schemas.py::test_set_schema_over_two_groups_one_stopped_then_sync": 13,
    "tests/cluster/test_broker_down.py::test_cluster_wide_stats_mark_unreachable_members": 10,
    "tests/cluster/test_broker_down.py::test_partial_views_name_the_missing_group": 13,
    "tests/cluster/test_cluster.py::test_cli_over_the_cluster": 23,
    "tests/cluster/test_cluster.py::test_cli_timeout_bounds_the_failover_wait": 10,
    "tests/cluster/test_cluster.py::test_produce_and_consume_across_three_brokers": 14,
    "tests/cluster/test_idempotent_restart.py::"
    "test_control_without_idempotence_is_at_least_once": 11,
    "tests/cluster/test_idempotent_restart.py::"
    "test_every_acknowledged_record_once_across_restarts[send_batch-keyless]": 14,
    "tests/cluster/test_idempotent_restart.py::"
    "test_every_acknowledged_record_once_across_restarts[send_batch]": 9,
    "tests/cluster/test_prometheus.py::test_prometheus_scrapes_the_cluster": 21,
    "tests/cluster/test_schema_routes.py::test_routes_show_each_groups_schema_versions": 9,
    "tests/cluster/test_spark_cluster_routing.py::"
    "test_a_streaming_query_rides_out_a_broker_restart": 21,
    "tests/cluster/test_spark_cluster_routing.py::"
    "test_batch_and_streaming_reads_over_three_brokers": 20,
    "tests/cluster/test_spark_cluster_routing.py::test_exactly_once_write_over_the_cluster": 11,
    "tests/cluster/test_spark_cluster_routing.py::"
    "test_fail_on_data_loss_when_retention_removes_one_brokers_records": 17,
    "tests/cluster/test_spark_cluster_routing.py::"
    "test_min_offsets_per_trigger_waits_for_rows_across_brokers": 16,
    "tests/cluster/test_spark_cluster_routing.py::"
    "test_recreated_topic_fails_or_is_read_from_earliest[everywhere]": 34,
    "tests/cluster/test_spark_cluster_routing.py::"
    "test_recreated_topic_fails_or_is_read_from_earliest[on-one-broker]": 23,
    "tests/cluster/test_spark_cluster_routing.py::"
    "test_starting_timestamp_picks_each_brokers_first_offset_at_or_after_it": 10,
    "tests/cluster/test_spark_cluster_routing.py::"
    "test_topic_patterns_tags_and_byte_limits_over_the_cluster": 10,
    "tests/console/test_alarms_live.py::"
    "test_a_lag_flapping_around_the_threshold_sends_no_storm": 28,
    "tests/console/test_alarms_live.py::"
    "test_a_lagging_group_fires_by_webhook_and_email_and_resolves_when_it_catches_up": 18,
    "tests/console/test_console_api.py::test_a_killed_broker_shows_as_not_answering": 12,
    "tests/console/test_console_api.py::test_read_only_without_a_tokens_file_and_the_browser": 11,
    "tests/console/test_console_browser.py::test_cluster_page_shows_members_roles_and_replicas": 15,
    "tests/console/test_console_prometheus.py::"
    "test_plots_come_from_prometheus_and_from_memory_when_it_fails": 13,
    "tests/contract/test_columns.py::test_columns_match_decode_records": 11,
    "tests/contract/test_columns.py::test_pyarrow_property": 10,
    "tests/contract/test_columns.py::test_too_large_for_32_bit_offsets": 16,
    "tests/contract/test_selector.py::test_any_text_parses_or_names_a_position": 20,
    "tests/hardening/test_crash_loop.py::"
    "test_async_mode_machine_crash_loses_only_the_last_flush_window": 30,
    "tests/hardening/test_crash_loop.py::test_async_mode_process_kill_loses_nothing": 15,
    "tests/hardening/test_crash_loop.py::"
    "test_kills_around_delete_topic_never_bring_the_topic_back[async]": 25,
    "tests/hardening/test_crash_loop.py::"
    "test_kills_around_delete_topic_never_bring_the_topic_back[sync]": 18,
    "tests/hardening/test_crash_loop.py::"
    "test_kills_during_retention_lose_nothing_retention_keeps": 19,
    "tests/hardening/test_crash_loop.py::"
    "test_kills_during_transaction_commits_are_all_or_nothing": 18,
    "tests/hardening/test_crash_loop.py::"
    "test_sync_mode_crash_loop_loses_and_duplicates_nothing": 39,
    "tests/hardening/test_crash_loop.py::test_the_harness_notices_lost_acknowledged_messages": 14,
    "tests/hardening/test_crash_loop_cluster.py::"
    "test_two_master_kills_lose_and_duplicate_nothing": 9,
    "tests/hardening/test_load.py::test_100_long_polling_consumers_and_8_producers": 17,
    "tests/project/test_packaging.py::test_wheel_in_a_clean_venv_serves_format_equeue": 124,
    "tests/replication/test_delayed_failover.py::"
    "test_the_elected_replica_delivers_the_pending_messages": 12,
    "tests/replication/test_delayed_failover.py::"
    "test_the_promoted_replica_delivers_the_pending_messages": 63,
    "tests/replication/test_election.py::"
    "test_zookeeper_down_master_stays_elections_resume_when_it_returns": 11,
    "tests/replication/test_failover.py::test_zookeeper_failover": 31,
    "tests/replication/test_idempotent_failover.py::"
    "test_failovers_duplicate_no_acknowledged_record[control]": 12,
    "tests/replication/test_idempotent_failover.py::"
    "test_failovers_duplicate_no_acknowledged_record[idempotent]": 12,
    "tests/replication/test_replica_reads.py::test_reads_from_replicas_and_failover": 22,
    "tests/replication/test_replica_txn_expiry.py::"
    "test_a_replica_never_expires_transactions_itself": 8,
    "tests/replication/test_role_from_namesrv.py::"
    "test_members_that_missed_a_promotion_learn_it_from_the_name_servers": 9,
    "tests/replication/test_sync_replication.py::"
    "test_a_restarted_replica_keeps_hiding_what_the_high_watermark_held": 22,
    "tests/replication/test_sync_replication.py::"
    "test_sync_acks_wait_for_in_sync_replicas_and_a_stopped_one_leaves": 11,
    "tests/replication/test_txn_check_failover.py::"
    "test_the_promoted_replica_continues_the_checks_and_commits": 14,
    "tests/replication/test_zk_command.py::"
    "test_the_development_zookeeper_runs_until_ctrl_c_and_keeps_its_data": 10,
    "tests/spark/test_checkpoint_compat.py::test_cluster_checkpoint_resumes": 11,
    "tests/spark/test_checkpoint_compat.py::test_single_broker_checkpoint_resumes": 8,
    "tests/spark/test_exactly_once_kill.py::"
    "test_copy_survives_driver_and_broker_kills_exactly_once": 412,
    "tests/spark/test_exactly_once_kill_two_brokers.py::"
    "test_two_broker_sink_driver_killed_between_the_brokers_commits": 146,
    "tests/spark/test_first_hour.py::test_readme_spark_example_reads_what_it_wrote": 56,
    "tests/spark/test_first_hour.py::test_the_wheel_ships_the_sample_config_and_the_unit": 18,
    "tests/spark/test_spark.py::test_available_now_in_several_batches_then_lag_zero": 21,
    "tests/spark/test_spark.py::test_batch_offsets_timestamps_and_partition_split": 8,
    "tests/spark/test_spark.py::"
    "test_checkpoint_without_incarnations_resumes_and_adopts_the_current_one": 10,
    "tests/spark/test_spark.py::test_continuous_query_commits_group_lag_zero_when_idle": 16,
    "tests/spark/test_spark.py::test_explicit_registration_works_too": 11,
    "tests/spark/test_spark.py::test_fail_on_data_loss_both_ways": 11,
    "tests/spark/test_spark.py::"
    "test_recreated_topic_under_a_checkpoint_fails_or_is_read_from_earliest": 15,
    "tests/spark/test_spark.py::test_restart_from_checkpoint_no_gap_no_duplicate": 23,
    "tests/spark/test_spark.py::test_streaming_json_start_leaves_unnamed_queues_at_latest": 11,
    "tests/spark/test_spark.py::test_write_then_read_round_trip": 55,
    "tests/spark/test_spark_cluster.py::test_standalone_cluster_write_read_stream": 223,
    "tests/spark/test_spark_delays.py::test_deliver_at_column_delays_each_row": 10,
    "tests/spark/test_spark_exactly_once.py::"
    "test_batch_write_with_a_failed_task_attempt_writes_once": 25,
    "tests/spark/test_spark_exactly_once.py::"
    "test_streaming_batch_replayed_after_a_crash_is_written_once[at_least_once]": 33,
    "tests/spark/test_spark_exactly_once.py::"
    "test_streaming_batch_replayed_after_a_crash_is_written_once[exactly_once]": 17,
    "tests/spark/test_spark_exactly_once.py::"
    "test_transactional_id_reused_with_a_new_checkpoint_is_refused": 19,
    "tests/spark/test_spark_failover.py::test_exactly_once_sink_survives_its_masters_sigkill": 38,
    "tests/spark/test_spark_kafka_names.py::"
    "test_a_kafka_streaming_query_runs_with_its_option_names": 14,
    "tests/spark/test_spark_pushdown.py::"
    "test_explain_shows_what_was_pushed_and_empty_ranges_read_nothing": 9,
    "tests/spark/test_spark_pushdown.py::"
    "test_filter_option_applies_to_batch_and_streaming_reads": 8,
    "tests/spark/test_spark_pushdown.py::"
    "test_pushed_queries_equal_spark_and_send_only_matching_records": 101,
    "tests/spark/test_spark_schemas.py::test_assigned_queues_of_a_cluster_decode": 14,
    "tests/spark/test_spark_schemas.py::test_corrupt_record_in_each_mode[avro]": 9,
    "tests/spark/test_spark_schemas.py::test_corrupt_record_in_each_mode[json]": 18,
    "tests/spark/test_spark_schemas.py::test_evolution_within_a_stream": 20,
    "tests/spark/test_spark_schemas.py::test_json_sink_round_trip": 20,
    "tests/spark/test_spark_schemas.py::"
    "test_restart_mode_stops_at_a_new_version_and_restarts_with_it": 20,
    "tests/spark/test_spark_schemas.py::test_sink_round_trip[at_least_once]": 10,
    "tests/spark/test_spark_schemas.py::test_sink_round_trip[exactly_once]": 22,
    "tests/spark/test_spark_writes.py::test_null_timestamp_is_the_store_time": 13,
    "tests/spark/test_spark_writes.py::"
    "test_null_value_names_the_column_and_count[exactly_once]": 16,
    "tests/storage/test_concurrency.py::test_concurrent_writers_and_reader[sync]": 11,
    "tests/storage/test_damage.py::"
    "test_offsets_lost_broker_answers_failed_precondition_until_reset": 10,
    "tests/storage/test_damage.py::test_sealed_chunk_header_flip_quarantines_the_chunk": 9,
    "tests/storage/test_recovery_delete.py::test_delete_cut_short_by_a_crash_at_each_step": 28,
    "tests/storage/test_recovery_delete.py::test_delete_cut_short_by_an_io_error_at_each_step": 20,
    "tests/storage/test_schemas_file.py::test_one_topic_cannot_fill_the_shared_file": 14,
    "tests/storage/test_stateful.py::TestStoreMachine::runTest": 19,
}
