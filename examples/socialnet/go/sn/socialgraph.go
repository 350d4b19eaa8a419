package sn

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"
)

// The social graph is kept in PostgreSQL (social_graph rows) and cached in
// Redis as sorted sets scored by when the follow happened: "fr:<id>" the
// user's followers, "fe:<id>" whom the user follows.
//
// A cached set is complete only once its marker "<key>:full" exists: a
// reader that finds no marker loads the set from PostgreSQL, ZADDs it and
// sets the marker. Writers always ZADD. Since ZADD is a union, a follow
// that lands while a reader loads an older copy from PostgreSQL is kept
// either way (its ZADD and the reader's both add it, or the reader's copy
// already has it). An unfollow racing a load could be undone by it; the
// workloads never unfollow.

type graphReq struct {
	Op           string `json:"op"`
	UserID       int64  `json:"user_id"`
	FolloweeID   int64  `json:"followee_id"`
	UserName     string `json:"user_name"`
	FolloweeName string `json:"followee_name"`
}

// SocialGraph (sn-social-graph): follow, unfollow (by id or by name), a
// user's followers and followees.
func SocialGraph(ctx Ctx, in []byte) ([]byte, error) {
	var req graphReq
	if err := decode(in, &req); err != nil {
		return nil, err
	}
	switch req.Op {
	case "follow", "unfollow":
		if req.UserID <= 0 || req.FolloweeID <= 0 || req.UserID == req.FolloweeID {
			return nil, badInput("%s needs user_id and followee_id, two different users", req.Op)
		}
		return followOp(ctx, req.Op == "follow", req.UserID, req.FolloweeID)
	case "follow_with_username", "unfollow_with_username":
		var ids [2]int64
		err := parallel(
			func() error { return userID(ctx, req.UserName, &ids[0]) },
			func() error { return userID(ctx, req.FolloweeName, &ids[1]) },
		)
		if err != nil {
			return nil, err
		}
		if ids[0] == ids[1] {
			return nil, badInput("a user cannot follow themselves")
		}
		return followOp(ctx, req.Op == "follow_with_username", ids[0], ids[1])
	case "get_followers", "get_followees":
		if req.UserID <= 0 {
			return nil, badInput("%s needs user_id", req.Op)
		}
		ids, err := graphSet(ctx.GoContext(), req.Op == "get_followers", req.UserID)
		if err != nil {
			return nil, err
		}
		return reply(map[string][]int64{"user_ids": ids})
	}
	return nil, badInput("sn-social-graph: unknown op %q", req.Op)
}

func userID(ctx Ctx, name string, out *int64) error {
	var r struct {
		UserID int64 `json:"user_id"`
	}
	if err := call(ctx, SvcUser, map[string]string{"op": "get_user_id", "username": name}, &r); err != nil {
		return err
	}
	*out = r.UserID
	return nil
}

func followOp(ctx Ctx, follow bool, user, followee int64) ([]byte, error) {
	gctx := ctx.GoContext()
	db, err := pg(gctx)
	if err != nil {
		return nil, err
	}
	now := time.Now().UnixMilli()
	if follow {
		_, err = db.Exec(gctx, `INSERT INTO social_graph (follower_id, followee_id, ts) VALUES ($1, $2, $3)
			ON CONFLICT DO NOTHING`, user, followee, now)
	} else {
		_, err = db.Exec(gctx, `DELETE FROM social_graph WHERE follower_id = $1 AND followee_id = $2`, user, followee)
	}
	if err != nil {
		return nil, fmt.Errorf("social graph: %w", err)
	}
	_, err = rdb().Pipelined(gctx, func(p redis.Pipeliner) error {
		fe, fr := "fe:"+strconv.FormatInt(user, 10), "fr:"+strconv.FormatInt(followee, 10)
		if follow {
			p.ZAdd(gctx, fe, redis.Z{Score: float64(now), Member: followee})
			p.ZAdd(gctx, fr, redis.Z{Score: float64(now), Member: user})
		} else {
			p.ZRem(gctx, fe, followee)
			p.ZRem(gctx, fr, user)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("redis: %w", err)
	}
	return reply(map[string]bool{"ok": true})
}

// graphSet reads a user's followers (or followees) through Redis.
func graphSet(ctx context.Context, followers bool, user int64) ([]int64, error) {
	key := "fe:" + strconv.FormatInt(user, 10)
	query := `SELECT followee_id, ts FROM social_graph WHERE follower_id = $1`
	if followers {
		key = "fr:" + strconv.FormatInt(user, 10)
		query = `SELECT follower_id, ts FROM social_graph WHERE followee_id = $1`
	}
	return readCachedSet(ctx, key, query, user, func(p redis.Pipeliner) *redis.StringSliceCmd {
		return p.ZRange(ctx, key, 0, -1)
	})
}

// readCachedSet reads a sorted set of ids that Redis caches for
// PostgreSQL: `read`'s answer if the set is complete ("<key>:full"
// exists), else after loading `query`'s (id, score) rows for `id` into it
// and marking it complete (see the top of this file for why a union makes
// this safe against concurrent writers).
func readCachedSet(ctx context.Context, key, query string, id int64,
	read func(p redis.Pipeliner) *redis.StringSliceCmd) ([]int64, error) {
	var full *redis.IntCmd
	var page *redis.StringSliceCmd
	if _, err := rdb().Pipelined(ctx, func(p redis.Pipeliner) error {
		full = p.Exists(ctx, key+":full")
		page = read(p)
		return nil
	}); err != nil {
		return nil, fmt.Errorf("redis: %w", err)
	}
	if full.Val() == 1 {
		return parseIDs(page.Val())
	}
	db, err := pg(ctx)
	if err != nil {
		return nil, err
	}
	rows, err := db.Query(ctx, query, id)
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w", key, err)
	}
	type member struct{ ID, Score int64 }
	members, err := pgx.CollectRows(rows, pgx.RowToStructByPos[member])
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w", key, err)
	}
	zs := make([]redis.Z, 0, len(members))
	for _, m := range members {
		zs = append(zs, redis.Z{Score: float64(m.Score), Member: m.ID})
	}
	if _, err := rdb().Pipelined(ctx, func(p redis.Pipeliner) error {
		if len(zs) > 0 {
			p.ZAdd(ctx, key, zs...)
		}
		p.Set(ctx, key+":full", 1, 0)
		page = read(p)
		return nil
	}); err != nil {
		return nil, fmt.Errorf("redis: %w", err)
	}
	return parseIDs(page.Val())
}

func parseIDs(ss []string) ([]int64, error) {
	out := make([]int64, 0, len(ss))
	for _, s := range ss {
		id, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return nil, fmt.Errorf("redis holds a bad id %q", s)
		}
		out = append(out, id)
	}
	return out, nil
}
