--
-- PostgreSQL database dump
--


-- Dumped from database version 15.18 (Debian 15.18-0+deb12u1)
-- Dumped by pg_dump version 15.18 (Debian 15.18-0+deb12u1)

SET statement_timeout = 0;
SET lock_timeout = 0;
SET idle_in_transaction_session_timeout = 0;
SET client_encoding = 'UTF8';
SET standard_conforming_strings = on;
SELECT pg_catalog.set_config('search_path', '', false);
SET check_function_bodies = false;
SET xmloption = content;
SET client_min_messages = warning;
SET row_security = off;

SET default_tablespace = '';

SET default_table_access_method = heap;

--
-- Name: alembic_version; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.alembic_version (
    version_num character varying(32) NOT NULL
);


--
-- Name: batches; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.batches (
    id integer NOT NULL,
    name character varying(200) NOT NULL,
    config json NOT NULL,
    status character varying(32) NOT NULL,
    created_at double precision NOT NULL,
    started_at double precision,
    finished_at double precision,
    flow_run_id character varying(64),
    error text,
    heartbeat_at double precision
);


--
-- Name: batches_id_seq; Type: SEQUENCE; Schema: public; Owner: -
--

CREATE SEQUENCE public.batches_id_seq
    AS integer
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1;


--
-- Name: batches_id_seq; Type: SEQUENCE OWNED BY; Schema: public; Owner: -
--

ALTER SEQUENCE public.batches_id_seq OWNED BY public.batches.id;


--
-- Name: samples; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.samples (
    id integer NOT NULL,
    batch_id integer NOT NULL,
    index integer NOT NULL,
    task_id character varying(200) NOT NULL,
    task json NOT NULL,
    status character varying(20) NOT NULL,
    steps_done integer NOT NULL,
    score double precision,
    result json,
    error text,
    admitted_at double precision,
    finished_at double precision,
    last_worker character varying(200),
    lease_owner character varying(200),
    lease_expires_at double precision,
    retries integer DEFAULT 0 NOT NULL,
    task_group character varying(200),
    in_flight_step integer
);


--
-- Name: samples_id_seq; Type: SEQUENCE; Schema: public; Owner: -
--

CREATE SEQUENCE public.samples_id_seq
    AS integer
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1;


--
-- Name: samples_id_seq; Type: SEQUENCE OWNED BY; Schema: public; Owner: -
--

ALTER SEQUENCE public.samples_id_seq OWNED BY public.samples.id;


--
-- Name: steps; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.steps (
    id integer NOT NULL,
    batch_id integer NOT NULL,
    sample_id integer NOT NULL,
    index integer NOT NULL,
    kind character varying(20) NOT NULL,
    status character varying(20) NOT NULL,
    attempt integer NOT NULL,
    enqueued_at double precision NOT NULL,
    started_at double precision NOT NULL,
    finished_at double precision,
    worker character varying(200),
    prompt_tokens integer,
    cached_prompt_tokens integer,
    recomputed_tokens integer,
    output_tokens integer,
    prefill_s double precision,
    decode_s double precision,
    engine_queue_s double precision,
    tool_calls integer,
    request json,
    response json,
    error text,
    task_run_id character varying(64)
);


--
-- Name: steps_id_seq; Type: SEQUENCE; Schema: public; Owner: -
--

CREATE SEQUENCE public.steps_id_seq
    AS integer
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1;


--
-- Name: steps_id_seq; Type: SEQUENCE OWNED BY; Schema: public; Owner: -
--

ALTER SEQUENCE public.steps_id_seq OWNED BY public.steps.id;


--
-- Name: suite_runs; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.suite_runs (
    batch_id integer NOT NULL,
    suite_key character varying(32) NOT NULL,
    workload_kind character varying(200) NOT NULL,
    tasks integer NOT NULL,
    tag character varying(200),
    deployment character varying(200),
    deployment_id character varying(64),
    priors_source character varying(20),
    priors_runs integer DEFAULT 0 NOT NULL,
    priors_tasks integer DEFAULT 0 NOT NULL
);


--
-- Name: worker_metrics; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.worker_metrics (
    id integer NOT NULL,
    batch_id integer NOT NULL,
    worker character varying(200) NOT NULL,
    t double precision NOT NULL,
    prefix_cache_queries double precision NOT NULL,
    prefix_cache_hits double precision NOT NULL,
    kv_cache_usage double precision,
    running integer NOT NULL,
    waiting integer NOT NULL,
    preemptions double precision NOT NULL,
    prompt_tokens double precision NOT NULL,
    generation_tokens double precision NOT NULL
);


--
-- Name: worker_metrics_id_seq; Type: SEQUENCE; Schema: public; Owner: -
--

CREATE SEQUENCE public.worker_metrics_id_seq
    AS integer
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1;


--
-- Name: worker_metrics_id_seq; Type: SEQUENCE OWNED BY; Schema: public; Owner: -
--

ALTER SEQUENCE public.worker_metrics_id_seq OWNED BY public.worker_metrics.id;


--
-- Name: workers; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.workers (
    id integer NOT NULL,
    batch_id integer NOT NULL,
    name character varying(200) NOT NULL,
    kind character varying(20) NOT NULL,
    endpoint character varying(500),
    settings json,
    metrics json
);


--
-- Name: workers_id_seq; Type: SEQUENCE; Schema: public; Owner: -
--

CREATE SEQUENCE public.workers_id_seq
    AS integer
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1;


--
-- Name: workers_id_seq; Type: SEQUENCE OWNED BY; Schema: public; Owner: -
--

ALTER SEQUENCE public.workers_id_seq OWNED BY public.workers.id;


--
-- Name: batches id; Type: DEFAULT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.batches ALTER COLUMN id SET DEFAULT nextval('public.batches_id_seq'::regclass);


--
-- Name: samples id; Type: DEFAULT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.samples ALTER COLUMN id SET DEFAULT nextval('public.samples_id_seq'::regclass);


--
-- Name: steps id; Type: DEFAULT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.steps ALTER COLUMN id SET DEFAULT nextval('public.steps_id_seq'::regclass);


--
-- Name: worker_metrics id; Type: DEFAULT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.worker_metrics ALTER COLUMN id SET DEFAULT nextval('public.worker_metrics_id_seq'::regclass);


--
-- Name: workers id; Type: DEFAULT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.workers ALTER COLUMN id SET DEFAULT nextval('public.workers_id_seq'::regclass);


--
-- Data for Name: alembic_version; Type: TABLE DATA; Schema: public; Owner: -
--

INSERT INTO public.alembic_version VALUES ('0004_sample_group');
INSERT INTO public.alembic_version VALUES ('u18_batch_heartbeat');
INSERT INTO public.alembic_version VALUES ('h01_suite_runs');
INSERT INTO public.alembic_version VALUES ('r16_in_flight_step');


--
-- Data for Name: batches; Type: TABLE DATA; Schema: public; Owner: -
--

INSERT INTO public.batches VALUES (1, 'bfcl-ckpt-1', '{"workload": {"kind": "bfcl", "limit": 4}, "note": "it''s \"quoted\", \u00fc, \ud83d\ude00, a\nnewline"}', 'running', 1764700000.123456, 1764700001.5, NULL, '6f1c2d8e-0000-4000-8000-000000000001', NULL, 1764700100.25);
INSERT INTO public.batches VALUES (2, 'mcp-run', '{"workload": {"kind": "mcp"}}', 'failed', 1764700200, 1764700201, 1764700300, NULL, 'it''s "quoted", ü, 😀, a
newline', NULL);


--
-- Data for Name: samples; Type: TABLE DATA; Schema: public; Owner: -
--

INSERT INTO public.samples VALUES (1, 1, 0, 'multi_turn_base_0', '{"q": "it''s \"quoted\", \u00fc, \ud83d\ude00, a\nnewline", "n": [1, 2]}', 'completed', 3, 1, '{"valid": true}', NULL, 1764700002, 1764700050, 'w0', NULL, NULL, 1, 'base', NULL);
INSERT INTO public.samples VALUES (2, 1, 1, 'multi_turn_base_1', '{}', 'running', 1, NULL, 'null', NULL, 1764700003, NULL, 'w1', 'host:123:abcd', 1764700130, 0, 'base', 1);
INSERT INTO public.samples VALUES (3, 1, 2, 'multi_turn_long_0', '{"k": null}', 'pending', 0, NULL, 'null', NULL, NULL, NULL, NULL, NULL, NULL, 0, NULL, NULL);
INSERT INTO public.samples VALUES (4, 1, 3, 'multi_turn_long_1', '{}', 'failed', 1, 0, 'null', 'it''s "quoted", ü, 😀, a
newline', 1764700004, 1764700060, 'w0', NULL, NULL, 0, 'long', NULL);
INSERT INTO public.samples VALUES (5, 2, 0, 't0', '{"prompt": "x"}', 'failed', 0, NULL, 'null', 'engine down', 1764700202, 1764700250, NULL, NULL, NULL, 0, NULL, NULL);


--
-- Data for Name: steps; Type: TABLE DATA; Schema: public; Owner: -
--

INSERT INTO public.steps VALUES (1, 1, 1, 0, 'inference', 'completed', 1, 1764700002, 1764700002.5, 1764700004.75, 'w0', 812, 0, 0, 64, 0.125, 1.5, 0.01, 1, '{"messages": [{"role": "user", "content": "it''s \"quoted\", \u00fc, \ud83d\ude00, a\nnewline"}]}', '{"content": "it''s \"quoted\", \u00fc, \ud83d\ude00, a\nnewline", "tool_calls": [{"name": "ls", "arguments": {}}]}', NULL, '00000000-0000-4000-8000-00000000000a');
INSERT INTO public.steps VALUES (2, 1, 1, 0, 'inference', 'abandoned', 2, 1764700002, 1764700005, 1764700006, 'w0', 812, 0, 0, 64, 0.125, 1.5, 0.01, 1, '{"messages": [{"role": "user", "content": "it''s \"quoted\", \u00fc, \ud83d\ude00, a\nnewline"}]}', '{"content": "it''s \"quoted\", \u00fc, \ud83d\ude00, a\nnewline", "tool_calls": [{"name": "ls", "arguments": {}}]}', NULL, '00000000-0000-4000-8000-00000000000a');
INSERT INTO public.steps VALUES (3, 1, 1, 1, 'environment', 'completed', 1, 1764700002, 1764700002.5, 1764700004.75, 'env-0', NULL, NULL, NULL, NULL, NULL, NULL, NULL, 1, '{"name": "ls"}', '{"output": "a b"}', NULL, NULL);
INSERT INTO public.steps VALUES (4, 1, 1, 2, 'inference', 'completed', 1, 1764700002, 1764700002.5, 1764700004.75, 'w0', 812, 800, 0, 12, 0.125, 1.5, 0.01, 1, '{"messages": [{"role": "user", "content": "it''s \"quoted\", \u00fc, \ud83d\ude00, a\nnewline"}]}', '{"content": "it''s \"quoted\", \u00fc, \ud83d\ude00, a\nnewline", "tool_calls": [{"name": "ls", "arguments": {}}]}', NULL, '00000000-0000-4000-8000-00000000000a');
INSERT INTO public.steps VALUES (5, 1, 2, 0, 'inference', 'completed', 1, 1764700002, 1764700002.5, 1764700004.75, 'w0', 812, 0, 0, 64, 0.125, 1.5, 0.01, 1, '{"messages": [{"role": "user", "content": "it''s \"quoted\", \u00fc, \ud83d\ude00, a\nnewline"}]}', '{"content": "it''s \"quoted\", \u00fc, \ud83d\ude00, a\nnewline", "tool_calls": [{"name": "ls", "arguments": {}}]}', NULL, '00000000-0000-4000-8000-00000000000a');
INSERT INTO public.steps VALUES (6, 1, 2, 1, 'environment', 'abandoned', 1, 1764700002, 1764700002.5, NULL, 'w0', 812, 0, 0, 64, 0.125, 1.5, 0.01, 1, '{"messages": [{"role": "user", "content": "it''s \"quoted\", \u00fc, \ud83d\ude00, a\nnewline"}]}', 'null', 'process died', '00000000-0000-4000-8000-00000000000a');
INSERT INTO public.steps VALUES (7, 1, 4, 0, 'inference', 'failed', 1, 1764700002, 1764700002.5, 1764700004.75, 'w0', 812, 0, 0, 64, 0.125, 1.5, 0.01, 1, '{"messages": [{"role": "user", "content": "it''s \"quoted\", \u00fc, \ud83d\ude00, a\nnewline"}]}', 'null', 'it''s "quoted", ü, 😀, a
newline', '00000000-0000-4000-8000-00000000000a');


--
-- Data for Name: suite_runs; Type: TABLE DATA; Schema: public; Owner: -
--

INSERT INTO public.suite_runs VALUES (1, '3f2a9c0d1e2b4a5c', 'bfcl', 4, 'ckpt-1', NULL, NULL, 'history', 2, 4);


--
-- Data for Name: worker_metrics; Type: TABLE DATA; Schema: public; Owner: -
--

INSERT INTO public.worker_metrics VALUES (1, 1, 'w0', 1764700010, 1000, 800, 0.25, 3, 1, 0, 2000, 300);
INSERT INTO public.worker_metrics VALUES (2, 1, 'w0', 1764700020, 3000, 2500, NULL, 2, 0, 1, 5000, 900);


--
-- Data for Name: workers; Type: TABLE DATA; Schema: public; Owner: -
--

INSERT INTO public.workers VALUES (1, 1, 'w0', 'engine', 'http://127.0.0.1:8001/v1', '{"max_num_seqs": 64}', '{"kv_cache_usage": 0.5}');
INSERT INTO public.workers VALUES (2, 1, 'env-0', 'environment', NULL, 'null', 'null');


--
-- Name: batches_id_seq; Type: SEQUENCE SET; Schema: public; Owner: -
--

SELECT pg_catalog.setval('public.batches_id_seq', 2, true);


--
-- Name: samples_id_seq; Type: SEQUENCE SET; Schema: public; Owner: -
--

SELECT pg_catalog.setval('public.samples_id_seq', 5, true);


--
-- Name: steps_id_seq; Type: SEQUENCE SET; Schema: public; Owner: -
--

SELECT pg_catalog.setval('public.steps_id_seq', 7, true);


--
-- Name: worker_metrics_id_seq; Type: SEQUENCE SET; Schema: public; Owner: -
--

SELECT pg_catalog.setval('public.worker_metrics_id_seq', 2, true);


--
-- Name: workers_id_seq; Type: SEQUENCE SET; Schema: public; Owner: -
--

SELECT pg_catalog.setval('public.workers_id_seq', 2, true);


--
-- Name: alembic_version alembic_version_pkc; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.alembic_version
    ADD CONSTRAINT alembic_version_pkc PRIMARY KEY (version_num);


--
-- Name: batches batches_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.batches
    ADD CONSTRAINT batches_pkey PRIMARY KEY (id);


--
-- Name: samples samples_batch_id_index_key; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.samples
    ADD CONSTRAINT samples_batch_id_index_key UNIQUE (batch_id, index);


--
-- Name: samples samples_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.samples
    ADD CONSTRAINT samples_pkey PRIMARY KEY (id);


--
-- Name: steps steps_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.steps
    ADD CONSTRAINT steps_pkey PRIMARY KEY (id);


--
-- Name: steps steps_sample_id_index_attempt_key; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.steps
    ADD CONSTRAINT steps_sample_id_index_attempt_key UNIQUE (sample_id, index, attempt);


--
-- Name: suite_runs suite_runs_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.suite_runs
    ADD CONSTRAINT suite_runs_pkey PRIMARY KEY (batch_id);


--
-- Name: worker_metrics worker_metrics_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.worker_metrics
    ADD CONSTRAINT worker_metrics_pkey PRIMARY KEY (id);


--
-- Name: workers workers_batch_id_name_key; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.workers
    ADD CONSTRAINT workers_batch_id_name_key UNIQUE (batch_id, name);


--
-- Name: workers workers_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.workers
    ADD CONSTRAINT workers_pkey PRIMARY KEY (id);


--
-- Name: ix_samples_batch_id; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX ix_samples_batch_id ON public.samples USING btree (batch_id);


--
-- Name: ix_samples_task; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX ix_samples_task ON public.samples USING btree (task_id);


--
-- Name: ix_steps_batch_status; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX ix_steps_batch_status ON public.steps USING btree (batch_id, status);


--
-- Name: ix_steps_sample_id; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX ix_steps_sample_id ON public.steps USING btree (sample_id);


--
-- Name: ix_suite_runs_suite_key; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX ix_suite_runs_suite_key ON public.suite_runs USING btree (suite_key);


--
-- Name: ix_worker_metrics_batch_worker_t; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX ix_worker_metrics_batch_worker_t ON public.worker_metrics USING btree (batch_id, worker, t);


--
-- Name: ix_workers_batch_id; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX ix_workers_batch_id ON public.workers USING btree (batch_id);


--
-- Name: ux_steps_one_completion; Type: INDEX; Schema: public; Owner: -
--

CREATE UNIQUE INDEX ux_steps_one_completion ON public.steps USING btree (sample_id, index) WHERE ((status)::text = 'completed'::text);


--
-- Name: samples samples_batch_id_fkey; Type: FK CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.samples
    ADD CONSTRAINT samples_batch_id_fkey FOREIGN KEY (batch_id) REFERENCES public.batches(id) ON DELETE CASCADE;


--
-- Name: steps steps_batch_id_fkey; Type: FK CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.steps
    ADD CONSTRAINT steps_batch_id_fkey FOREIGN KEY (batch_id) REFERENCES public.batches(id) ON DELETE CASCADE;


--
-- Name: steps steps_sample_id_fkey; Type: FK CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.steps
    ADD CONSTRAINT steps_sample_id_fkey FOREIGN KEY (sample_id) REFERENCES public.samples(id) ON DELETE CASCADE;


--
-- Name: suite_runs suite_runs_batch_id_fkey; Type: FK CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.suite_runs
    ADD CONSTRAINT suite_runs_batch_id_fkey FOREIGN KEY (batch_id) REFERENCES public.batches(id) ON DELETE CASCADE;


--
-- Name: worker_metrics worker_metrics_batch_id_fkey; Type: FK CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.worker_metrics
    ADD CONSTRAINT worker_metrics_batch_id_fkey FOREIGN KEY (batch_id) REFERENCES public.batches(id) ON DELETE CASCADE;


--
-- Name: workers workers_batch_id_fkey; Type: FK CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.workers
    ADD CONSTRAINT workers_batch_id_fkey FOREIGN KEY (batch_id) REFERENCES public.batches(id) ON DELETE CASCADE;


--
-- PostgreSQL database dump complete
--


