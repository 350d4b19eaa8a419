package sn

import (
	"encoding/json"
	"errors"
	"fmt"
	"strconv"

	"github.com/bradfitz/gomemcache/memcache"
	"github.com/jackc/pgx/v5/pgconn"
)

// PostStorage (sn-post-storage): posts in PostgreSQL's posts table, read
// through memcached ("p:<post_id>").
func PostStorage(ctx Ctx, in []byte) ([]byte, error) {
	var req struct {
		Op      string  `json:"op"`
		Post    *Post   `json:"post"`
		PostIDs []int64 `json:"post_ids"`
	}
	if err := decode(in, &req); err != nil {
		return nil, err
	}
	switch req.Op {
	case "store_post":
		if req.Post == nil || req.Post.PostID <= 0 {
			return nil, badInput("store_post needs a post with a post_id")
		}
		return storePost(ctx, req.Post)
	case "read_posts":
		if len(req.PostIDs) > TimelineLenMax {
			return nil, badInput("at most %d posts at once", TimelineLenMax)
		}
		posts, err := readPosts(ctx, req.PostIDs)
		if err != nil {
			return nil, err
		}
		return reply(posts)
	}
	return nil, badInput("sn-post-storage: unknown op %q", req.Op)
}

func storePost(ctx Ctx, p *Post) ([]byte, error) {
	doc, err := json.Marshal(p)
	if err != nil {
		return nil, err
	}
	db, err := pg(ctx.GoContext())
	if err != nil {
		return nil, err
	}
	_, err = db.Exec(ctx.GoContext(), `INSERT INTO posts (post_id, doc) VALUES ($1, $2)`, p.PostID, doc)
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "23505" {
		return nil, fmt.Errorf("post id %d is taken (two unique-id processes collided?)", p.PostID)
	}
	if err != nil {
		return nil, fmt.Errorf("storing post %d: %w", p.PostID, err)
	}
	return reply(map[string]bool{"ok": true})
}

// readPosts reads posts in the order asked: one memcached multi-get, the
// misses from PostgreSQL in one query (written back to the cache). A post
// not stored (yet: compose-post writes the timelines and the post at once)
// is left out.
func readPosts(ctx Ctx, ids []int64) ([]json.RawMessage, error) {
	out := make([]json.RawMessage, 0, len(ids))
	if len(ids) == 0 {
		return out, nil
	}
	keys := make([]string, len(ids))
	for i, id := range ids {
		keys[i] = "p:" + strconv.FormatInt(id, 10)
	}
	hits, err := mc().GetMulti(keys)
	if err != nil {
		return nil, fmt.Errorf("memcached: %w", err)
	}
	docs := make(map[int64][]byte, len(ids))
	var misses []int64
	for i, id := range ids {
		if it, ok := hits[keys[i]]; ok {
			docs[id] = it.Value
		} else {
			misses = append(misses, id)
		}
	}
	if len(misses) > 0 {
		db, err := pg(ctx.GoContext())
		if err != nil {
			return nil, err
		}
		rows, err := db.Query(ctx.GoContext(), `SELECT post_id, doc FROM posts WHERE post_id = ANY($1)`, misses)
		if err != nil {
			return nil, fmt.Errorf("reading posts: %w", err)
		}
		defer rows.Close()
		for rows.Next() {
			var id int64
			var doc []byte
			if err := rows.Scan(&id, &doc); err != nil {
				return nil, fmt.Errorf("reading posts: %w", err)
			}
			docs[id] = doc
			_ = mc().Set(&memcache.Item{Key: "p:" + strconv.FormatInt(id, 10), Value: doc})
		}
		if err := rows.Err(); err != nil {
			return nil, fmt.Errorf("reading posts: %w", err)
		}
	}
	for _, id := range ids {
		if d, ok := docs[id]; ok {
			out = append(out, d)
		}
	}
	return out, nil
}
