"""Settings of the demo project; every deployment-specific value comes from the environment."""

from pathlib import Path

import django
import environ

BASE_DIR = Path(__file__).resolve().parent
env = environ.Env()
environ.Env.read_env(BASE_DIR / ".env")

SECRET_KEY = env.str("SECRET_KEY", default="demo-only-not-secret-change-me")
DEBUG = env.bool("DEBUG", default=True)
ALLOWED_HOSTS = env.list("ALLOWED_HOSTS", default=["127.0.0.1", "localhost"])

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "echomq_django",
    "demo_project.demo_app",
    "demo_project.shop",  # a Celery project's tasks.py, moved by changing its imports (shop/tasks.py)
]
if django.VERSION < (6,):
    # Django 5.2 LTS gets the Tasks framework from the backport (pip install "echomq-django[tasks]").
    INSTALLED_APPS.append("django_tasks")

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "demo_project.urls"
WSGI_APPLICATION = "demo_project.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

DATABASES = {"default": env.db("DATABASE_URL", default=f"sqlite:///{BASE_DIR / 'db.sqlite3'}")}
if DATABASES["default"]["ENGINE"].endswith("sqlite3"):
    # A file, not memory, so that processes started by the tests share the test database; named
    # after the database (test_db.sqlite3 beside db.sqlite3), so runs on two databases can overlap.
    _database = Path(DATABASES["default"]["NAME"])
    DATABASES["default"]["TEST"] = {"NAME": str(_database.with_name(f"test_{_database.name}"))}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

USE_TZ = True
TIME_ZONE = "UTC"
STATIC_URL = "static/"

ECHOMQ = {
    "REDIS_URL": env.str("ECHOMQ_REDIS_URL", default="redis://127.0.0.1:6379/0"),
    "PREFIX": env.str("ECHOMQ_PREFIX", default="emq"),
    # Jobs enqueued inside a transaction are written with it and sent after its commit (see the outbox in
    # docs/reliability.md); sent at once (or on commit, for tasks) when off.
    "OUTBOX": env.bool("ECHOMQ_OUTBOX", default=False),
    "QUEUES": {
        "default": {},
        # Short timings so the demo shows a stall and its recovery within seconds.
        "demo": {"LOCK_DURATION": 3, "SWEEP_INTERVAL": 2},
        # Jobs in child processes: a time limit kills the child, a cancel reaches a running job.
        "heavy": {"POOL": "processes", "CONCURRENCY": 2, "LOCK_DURATION": 3, "SWEEP_INTERVAL": 2},
        # Flow control across all workers: at most 5 calls started a second, one running per tenant (group).
        "api": {"RATE_LIMIT": {"MAX": 5, "DURATION": 1}, "GROUP_MAX_ACTIVE": 1},
    },
    # Fired by `manage.py echomq_beat`: each tick is one job, however many beats run.
    "SCHEDULES": {
        "heartbeat": {"TASK": "demo_project.demo_app.jobs.heartbeat", "EVERY": 3},
    },
}

# Django's Tasks framework runs on echomq: @task functions go through echomq_worker.
TASKS = {
    "default": {
        "BACKEND": "echomq_django.backends.EchoMQBackend",
        "QUEUES": ["default", "demo"],
    },
}
# No LOGGING for echomq: its commands print their own progress (-v 0 quiets them). A
# project whose LOGGING handles the "echomq" loggers gets the same lines there instead.
