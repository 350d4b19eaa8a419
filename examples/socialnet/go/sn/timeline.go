package sn

import (
	"encoding/json"
	"fmt"
	"strconv"

	"github.com/redis/go-redis/v9"
)

type timelineReq struct {
	Op             string  `json:"op"`
	UserID         int64   `json:"user_id"`
	PostID         int64   `json:"post_id"`
	Timestamp      int64   `json:"timestamp"`
	UserMentionIDs []int64 `json:"user_mention_ids"`
	Start          int64   `json:"start"`
	Stop           int64   `json:"stop"`
}

func (r timelineReq) checkWrite() error {
	if r.UserID <= 0 || r.PostID <= 0 || r.Timestamp <= 0 {
		return badInput("%s needs user_id, post_id and timestamp", r.Op)
	}
	if len(r.UserMentionIDs) > UserMentionMax {
		return badInput("at most %d mentions", UserMentionMax)
	}
	return nil
}

// UserTimeline (sn-user-timeline): a user's own posts, newest first, kept in
// PostgreSQL (user_timeline rows) and cached in Redis ("ut:<id>", complete
// once "ut:<id>:full" exists, as for the social graph).
func UserTimeline(ctx Ctx, in []byte) ([]byte, error) {
	var req timelineReq
	if err := decode(in, &req); err != nil {
		return nil, err
	}
	gctx := ctx.GoContext()
	switch req.Op {
	case "write_user_timeline":
		if err := req.checkWrite(); err != nil {
			return nil, err
		}
		db, err := pg(gctx)
		if err != nil {
			return nil, err
		}
		if _, err := db.Exec(gctx, `INSERT INTO user_timeline (user_id, post_id, ts) VALUES ($1, $2, $3)`,
			req.UserID, req.PostID, req.Timestamp); err != nil {
			return nil, fmt.Errorf("user timeline: %w", err)
		}
		key := "ut:" + strconv.FormatInt(req.UserID, 10)
		if err := rdb().ZAdd(gctx, key, redis.Z{Score: float64(req.Timestamp), Member: req.PostID}).Err(); err != nil {
			return nil, fmt.Errorf("redis: %w", err)
		}
		return reply(map[string]bool{"ok": true})
	case "read_user_timeline":
		r := Range{UserID: req.UserID, Start: req.Start, Stop: req.Stop}
		if err := r.check(); err != nil {
			return nil, err
		}
		ids, err := userTimelineIDs(ctx, r)
		if err != nil {
			return nil, err
		}
		return postsOf(ctx, ids)
	}
	return nil, badInput("sn-user-timeline: unknown op %q", req.Op)
}

func userTimelineIDs(ctx Ctx, r Range) ([]int64, error) {
	gctx := ctx.GoContext()
	key := "ut:" + strconv.FormatInt(r.UserID, 10)
	return readCachedSet(gctx, key, `SELECT post_id, ts FROM user_timeline WHERE user_id = $1`, r.UserID,
		func(p redis.Pipeliner) *redis.StringSliceCmd { return p.ZRevRange(gctx, key, r.Start, r.Stop-1) })
}

// postsOf answers a timeline read: the posts, from sn-post-storage.
func postsOf(ctx Ctx, ids []int64) ([]byte, error) {
	if len(ids) == 0 {
		return []byte("[]"), nil
	}
	var posts []json.RawMessage
	if err := call(ctx, SvcPostStorage, map[string]any{"op": "read_posts", "post_ids": ids}, &posts); err != nil {
		return nil, err
	}
	return reply(posts)
}

// HomeTimeline (sn-home-timeline): what a user's followees posted and the
// posts that mention the user, newest first, in Redis only ("ht:<id>", as
// DeathStarBench keeps it).
func HomeTimeline(ctx Ctx, in []byte) ([]byte, error) {
	var req timelineReq
	if err := decode(in, &req); err != nil {
		return nil, err
	}
	gctx := ctx.GoContext()
	switch req.Op {
	case "write_home_timeline":
		if err := req.checkWrite(); err != nil {
			return nil, err
		}
		var followers struct {
			UserIDs []int64 `json:"user_ids"`
		}
		if err := call(ctx, SvcSocialGraph, map[string]any{"op": "get_followers", "user_id": req.UserID}, &followers); err != nil {
			return nil, err
		}
		targets := make(map[int64]bool, len(followers.UserIDs)+len(req.UserMentionIDs))
		for _, id := range followers.UserIDs {
			targets[id] = true
		}
		for _, id := range req.UserMentionIDs {
			targets[id] = true
		}
		if len(targets) == 0 {
			return reply(map[string]int{"written": 0})
		}
		z := redis.Z{Score: float64(req.Timestamp), Member: req.PostID}
		if _, err := rdb().Pipelined(gctx, func(p redis.Pipeliner) error {
			for id := range targets {
				p.ZAdd(gctx, "ht:"+strconv.FormatInt(id, 10), z)
			}
			return nil
		}); err != nil {
			return nil, fmt.Errorf("redis: %w", err)
		}
		return reply(map[string]int{"written": len(targets)})
	case "read_home_timeline":
		r := Range{UserID: req.UserID, Start: req.Start, Stop: req.Stop}
		if err := r.check(); err != nil {
			return nil, err
		}
		page, err := rdb().ZRevRange(gctx, "ht:"+strconv.FormatInt(r.UserID, 10), r.Start, r.Stop-1).Result()
		if err != nil {
			return nil, fmt.Errorf("redis: %w", err)
		}
		ids, err := parseIDs(page)
		if err != nil {
			return nil, err
		}
		return postsOf(ctx, ids)
	}
	return nil, badInput("sn-home-timeline: unknown op %q", req.Op)
}
