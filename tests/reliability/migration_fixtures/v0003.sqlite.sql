BEGIN TRANSACTION;
CREATE TABLE alembic_version (
	version_num VARCHAR(32) NOT NULL, 
	CONSTRAINT alembic_version_pkc PRIMARY KEY (version_num)
);
INSERT INTO "alembic_version" VALUES('0003_sample_leases');
CREATE TABLE "batches" (
	id INTEGER NOT NULL, 
	name VARCHAR(200) NOT NULL, 
	config JSON NOT NULL, 
	status VARCHAR(32) NOT NULL, 
	created_at FLOAT NOT NULL, 
	started_at FLOAT, 
	finished_at FLOAT, 
	flow_run_id VARCHAR(64), 
	error TEXT, 
	PRIMARY KEY (id)
);
INSERT INTO "batches" VALUES(1,'bfcl-ckpt-1','{"workload": {"kind": "bfcl", "limit": 4}, "note": "it''s \"quoted\", \u00fc, \ud83d\ude00, a\nnewline"}','running',1.76470000012345600124e+09,1764700001.5,NULL,'6f1c2d8e-0000-4000-8000-000000000001',NULL);
INSERT INTO "batches" VALUES(2,'mcp-run','{"workload": {"kind": "mcp"}}','failed',1764700200.0,1764700201.0,1764700300.0,NULL,'it''s "quoted", ü, 😀, a
newline');
CREATE TABLE samples (
	id INTEGER NOT NULL, 
	batch_id INTEGER NOT NULL, 
	"index" INTEGER NOT NULL, 
	task_id VARCHAR(200) NOT NULL, 
	task JSON NOT NULL, 
	status VARCHAR(20) NOT NULL, 
	steps_done INTEGER NOT NULL, 
	score FLOAT, 
	result JSON, 
	error TEXT, 
	admitted_at FLOAT, 
	finished_at FLOAT, 
	last_worker VARCHAR(200), lease_owner VARCHAR(200), lease_expires_at FLOAT, retries INTEGER DEFAULT '0' NOT NULL, 
	PRIMARY KEY (id), 
	FOREIGN KEY(batch_id) REFERENCES batches (id) ON DELETE CASCADE, 
	UNIQUE (batch_id, "index")
);
INSERT INTO "samples" VALUES(1,1,0,'multi_turn_base_0','{"q": "it''s \"quoted\", \u00fc, \ud83d\ude00, a\nnewline", "n": [1, 2]}','completed',3,1.0,'{"valid": true}',NULL,1764700002.0,1764700050.0,'w0',NULL,NULL,1);
INSERT INTO "samples" VALUES(2,1,1,'multi_turn_base_1','{}','running',1,NULL,'null',NULL,1764700003.0,NULL,'w1','host:123:abcd',1764700130.0,0);
INSERT INTO "samples" VALUES(3,1,2,'multi_turn_long_0','{"k": null}','pending',0,NULL,'null',NULL,NULL,NULL,NULL,NULL,NULL,0);
INSERT INTO "samples" VALUES(4,1,3,'multi_turn_long_1','{}','failed',1,0.0,'null','it''s "quoted", ü, 😀, a
newline',1764700004.0,1764700060.0,'w0',NULL,NULL,0);
INSERT INTO "samples" VALUES(5,2,0,'t0','{"prompt": "x"}','failed',0,NULL,'null','engine down',1764700202.0,1764700250.0,NULL,NULL,NULL,0);
CREATE TABLE steps (
	id INTEGER NOT NULL, 
	batch_id INTEGER NOT NULL, 
	sample_id INTEGER NOT NULL, 
	"index" INTEGER NOT NULL, 
	kind VARCHAR(20) NOT NULL, 
	status VARCHAR(20) NOT NULL, 
	attempt INTEGER NOT NULL, 
	enqueued_at FLOAT NOT NULL, 
	started_at FLOAT NOT NULL, 
	finished_at FLOAT, 
	worker VARCHAR(200), 
	prompt_tokens INTEGER, 
	cached_prompt_tokens INTEGER, 
	recomputed_tokens INTEGER, 
	output_tokens INTEGER, 
	prefill_s FLOAT, 
	decode_s FLOAT, 
	engine_queue_s FLOAT, 
	tool_calls INTEGER, 
	request JSON, 
	response JSON, 
	error TEXT, 
	task_run_id VARCHAR(64), 
	PRIMARY KEY (id), 
	FOREIGN KEY(batch_id) REFERENCES batches (id) ON DELETE CASCADE, 
	FOREIGN KEY(sample_id) REFERENCES samples (id) ON DELETE CASCADE, 
	UNIQUE (sample_id, "index", attempt)
);
INSERT INTO "steps" VALUES(1,1,1,0,'inference','completed',1,1764700002.0,1764700002.5,1764700004.75,'w0',812,0,0,64,0.125,1.5,0.01,1,'{"messages": [{"role": "user", "content": "it''s \"quoted\", \u00fc, \ud83d\ude00, a\nnewline"}]}','{"content": "it''s \"quoted\", \u00fc, \ud83d\ude00, a\nnewline", "tool_calls": [{"name": "ls", "arguments": {}}]}',NULL,'00000000-0000-4000-8000-00000000000a');
INSERT INTO "steps" VALUES(2,1,1,0,'inference','abandoned',2,1764700002.0,1764700005.0,1764700006.0,'w0',812,0,0,64,0.125,1.5,0.01,1,'{"messages": [{"role": "user", "content": "it''s \"quoted\", \u00fc, \ud83d\ude00, a\nnewline"}]}','{"content": "it''s \"quoted\", \u00fc, \ud83d\ude00, a\nnewline", "tool_calls": [{"name": "ls", "arguments": {}}]}',NULL,'00000000-0000-4000-8000-00000000000a');
INSERT INTO "steps" VALUES(3,1,1,1,'environment','completed',1,1764700002.0,1764700002.5,1764700004.75,'env-0',NULL,NULL,NULL,NULL,NULL,NULL,NULL,1,'{"name": "ls"}','{"output": "a b"}',NULL,NULL);
INSERT INTO "steps" VALUES(4,1,1,2,'inference','completed',1,1764700002.0,1764700002.5,1764700004.75,'w0',812,800,0,12,0.125,1.5,0.01,1,'{"messages": [{"role": "user", "content": "it''s \"quoted\", \u00fc, \ud83d\ude00, a\nnewline"}]}','{"content": "it''s \"quoted\", \u00fc, \ud83d\ude00, a\nnewline", "tool_calls": [{"name": "ls", "arguments": {}}]}',NULL,'00000000-0000-4000-8000-00000000000a');
INSERT INTO "steps" VALUES(5,1,2,0,'inference','completed',1,1764700002.0,1764700002.5,1764700004.75,'w0',812,0,0,64,0.125,1.5,0.01,1,'{"messages": [{"role": "user", "content": "it''s \"quoted\", \u00fc, \ud83d\ude00, a\nnewline"}]}','{"content": "it''s \"quoted\", \u00fc, \ud83d\ude00, a\nnewline", "tool_calls": [{"name": "ls", "arguments": {}}]}',NULL,'00000000-0000-4000-8000-00000000000a');
INSERT INTO "steps" VALUES(6,1,2,1,'environment','abandoned',1,1764700002.0,1764700002.5,NULL,'w0',812,0,0,64,0.125,1.5,0.01,1,'{"messages": [{"role": "user", "content": "it''s \"quoted\", \u00fc, \ud83d\ude00, a\nnewline"}]}','null','process died','00000000-0000-4000-8000-00000000000a');
INSERT INTO "steps" VALUES(7,1,4,0,'inference','failed',1,1764700002.0,1764700002.5,1764700004.75,'w0',812,0,0,64,0.125,1.5,0.01,1,'{"messages": [{"role": "user", "content": "it''s \"quoted\", \u00fc, \ud83d\ude00, a\nnewline"}]}','null','it''s "quoted", ü, 😀, a
newline','00000000-0000-4000-8000-00000000000a');
CREATE TABLE worker_metrics (
	id INTEGER NOT NULL, 
	batch_id INTEGER NOT NULL, 
	worker VARCHAR(200) NOT NULL, 
	t FLOAT NOT NULL, 
	prefix_cache_queries FLOAT NOT NULL, 
	prefix_cache_hits FLOAT NOT NULL, 
	kv_cache_usage FLOAT, 
	running INTEGER NOT NULL, 
	waiting INTEGER NOT NULL, 
	preemptions FLOAT NOT NULL, 
	prompt_tokens FLOAT NOT NULL, 
	generation_tokens FLOAT NOT NULL, 
	PRIMARY KEY (id), 
	FOREIGN KEY(batch_id) REFERENCES batches (id) ON DELETE CASCADE
);
INSERT INTO "worker_metrics" VALUES(1,1,'w0',1764700010.0,1000.0,800.0,0.25,3,1,0.0,2000.0,300.0);
INSERT INTO "worker_metrics" VALUES(2,1,'w0',1764700020.0,3000.0,2500.0,NULL,2,0,1.0,5000.0,900.0);
CREATE TABLE workers (
	id INTEGER NOT NULL, 
	batch_id INTEGER NOT NULL, 
	name VARCHAR(200) NOT NULL, 
	kind VARCHAR(20) NOT NULL, 
	endpoint VARCHAR(500), 
	settings JSON, 
	metrics JSON, 
	PRIMARY KEY (id), 
	FOREIGN KEY(batch_id) REFERENCES batches (id) ON DELETE CASCADE, 
	UNIQUE (batch_id, name)
);
INSERT INTO "workers" VALUES(1,1,'w0','engine','http://127.0.0.1:8001/v1','{"max_num_seqs": 64}','{"kv_cache_usage": 0.5}');
INSERT INTO "workers" VALUES(2,1,'env-0','environment',NULL,'null','null');
CREATE INDEX ix_samples_batch_id ON samples (batch_id);
CREATE INDEX ix_samples_task ON samples (task_id);
CREATE INDEX ix_workers_batch_id ON workers (batch_id);
CREATE INDEX ix_steps_batch_status ON steps (batch_id, status);
CREATE INDEX ix_steps_sample_id ON steps (sample_id);
CREATE INDEX ix_worker_metrics_batch_worker_t ON worker_metrics (batch_id, worker, t);
CREATE UNIQUE INDEX ux_steps_one_completion ON steps (sample_id, "index") WHERE status = 'completed';
COMMIT;
