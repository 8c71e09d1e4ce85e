"""Routes of the learning side: releases, candidates, rollback, grow, harness."""

from fastapi import APIRouter

router = APIRouter()
